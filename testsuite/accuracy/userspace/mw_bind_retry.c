/*
 * segx: exposes a sequence of segments of one large buffer to a peer, one
 * at a time, through a single type-2 window: bind over segment i, let the
 * peer RDMA-WRITE it, invalidate (signaled, waited for), move on.
 *
 * Correct: a bind that completes in error is retried with the same new
 * key -- the failed bind never made that key valid, so reusing it is
 * safe; every LOCAL_INV is waited for before the window moves on.
 * Not correct: the key is computed once before the segment loop, so every
 * segment after the first is exposed under the key the peer already used
 * for the previous segment.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct segx {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *buf_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mw *mw;
	char          *buf;
	size_t         seg_size;
	int          (*announce)(struct segx *, int seg, uint32_t key);
	int          (*wait_peer_done)(struct segx *, int seg);
};

static int segx_wait(struct segx *x, int *status)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(x->cq, 1, &wc);
	while (n == 0);
	if (n < 0)
		return -EIO;
	*status = wc.status;
	return 0;
}

static int segx_bind(struct segx *x, int seg, uint32_t key)
{
	struct ibv_send_wr wr, *bad;
	int attempt, status;

	for (attempt = 0; attempt < 3; attempt++) {
		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds the window per segment
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.bind_mw.mw = x->mw;
		/* OK: rdma-rkey-reuse -- a retry after a failed bind: the key never became valid */
		wr.bind_mw.rkey = key;
		wr.bind_mw.bind_info.mr = x->buf_mr;
		wr.bind_mw.bind_info.addr = (uintptr_t)(x->buf + (size_t)seg * x->seg_size);
		wr.bind_mw.bind_info.length = x->seg_size;
		wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
		if (ibv_post_send(x->qp, &wr, &bad) || segx_wait(x, &status))
			return -EIO;
		if (status == IBV_WC_SUCCESS)
			return 0;
	}
	return -EIO;
}

static int segx_unbind(struct segx *x, uint32_t key)
{
	struct ibv_send_wr wr, *bad;
	int status;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = key;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(x->qp, &wr, &bad) || segx_wait(x, &status))
		return -EIO;
	return status == IBV_WC_SUCCESS ? 0 : -EIO;
}

int segx_run(struct segx *x, int nsegs)
{
	uint32_t key = ibv_inc_rkey(x->mw->rkey);
	int seg;

	for (seg = 0; seg < nsegs; seg++) {
		// BUG(file): rdma-rkey-reuse -- 'key' is computed once; each later segment is bound under the previous segment's key
		if (segx_bind(x, seg, key))
			return -EIO;
		if (x->announce(x, seg, key) || x->wait_peer_done(x, seg))
			return -EIO;
		/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completion is waited for before the next segment */
		if (segx_unbind(x, key))
			return -EIO;
	}
	return 0;
}
