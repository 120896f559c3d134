/*
 * strm: a streaming sink.  The receiver exposes a ring of buffers to the
 * sender through memory windows; when a buffer has been consumed, its
 * window is re-bound (moved to the next free buffer) and the new
 * (addr, rkey) is returned to the sender in a credit message.
 *
 * Two generations of the code live here: adapters with type-2 windows
 * rebind with an IBV_WR_BIND_MW work request; old adapters only offer
 * type-1 windows, rebound with ibv_bind_mw().
 *
 * Not correct: the type-2 path invalidates the window (and waits for it)
 * but then binds it again with the same rkey, so whoever kept a stale
 * credit can write into the buffer the window now exposes.
 * Correct: the type-1 path (ibv_bind_mw() gives the window a new key each
 * time); both wait for the bind before announcing the key.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#define STRM_RING	16
#define STRM_BUF	(64 * 1024)

struct strm_credit {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct strm_sink {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *ring_mr;	/* LOCAL_WRITE | MW_BIND */
	char          *ring;
	struct ibv_mw *mw[STRM_RING];
	int            type2;
};

static int strm_wait(struct strm_sink *s)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(s->cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

int strm_alloc_windows(struct strm_sink *s)
{
	int i;

	for (i = 0; i < STRM_RING; i++) {
		s->mw[i] = ibv_alloc_mw(s->pd, s->type2 ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!s->mw[i])
			goto undo;
	}
	return 0;
undo:
	/* OK: rdma-mr-leak -- the windows allocated before the failure are freed */
	while (i--)
		ibv_dealloc_mw(s->mw[i]);
	return -ENOMEM;
}

static int strm_rebind_type2(struct strm_sink *s, int slot, int buf_idx)
{
	struct ibv_send_wr wr, *bad;

	/* the consumed buffer's window dies first */
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = slot;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = s->mw[slot]->rkey;
	if (ibv_post_send(s->qp, &wr, &bad) || strm_wait(s))
		return -EIO;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = slot;
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP rebinds windows per buffer
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = s->mw[slot];
	wr.bind_mw.rkey = s->mw[slot]->rkey; // BUG: rdma-rkey-reuse -- the window is re-bound with its current key, not ibv_inc_rkey()
	wr.bind_mw.bind_info.mr = s->ring_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)(s->ring + (size_t)buf_idx * STRM_BUF);
	wr.bind_mw.bind_info.length = STRM_BUF;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(s->qp, &wr, &bad))
		return -EIO;
	return strm_wait(s);
}

static int strm_rebind_type1(struct strm_sink *s, int slot, int buf_idx)
{
	struct ibv_mw_bind b;

	memset(&b, 0, sizeof(b));
	b.wr_id = slot;
	b.send_flags = IBV_SEND_SIGNALED;
	b.bind_info.mr = s->ring_mr;
	b.bind_info.addr = (uintptr_t)(s->ring + (size_t)buf_idx * STRM_BUF);
	b.bind_info.length = STRM_BUF;
	b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	/* OK: rdma-rkey-reuse -- type-1 bind: the provider rotates the key */
	if (ibv_bind_mw(s->qp, s->mw[slot], &b)) // BUG: rdma-local-mr-management -- the ULP rebinds windows per buffer
		return -EIO;
	return strm_wait(s);
}

int strm_recycle(struct strm_sink *s, int slot, int next_buf, struct strm_credit *cr)
{
	int ret = s->type2 ? strm_rebind_type2(s, slot, next_buf)
			   : strm_rebind_type1(s, slot, next_buf);

	if (ret)
		return ret;
	cr->addr = (uintptr_t)(s->ring + (size_t)next_buf * STRM_BUF);
	cr->rkey = s->mw[slot]->rkey;
	cr->len = STRM_BUF;
	return 0;
}
