/*
 * rdmaq: a work-queue broker.  Consumers register "inbox" buffers; for each
 * task handed to a consumer the broker exposes the consumer's inbox slot to
 * the producer through a type-2 window (the producer RDMA-WRITEs the task
 * payload), and invalidates it with a signaled LOCAL_INV, waited for,
 * before the slot is reused.
 *
 * Not correct: the bind helper takes the key from a local copy of the
 * window's current rkey and never rotates it; after the LOCAL_INV the same
 * key becomes valid again on the next bind, so a producer that kept it can
 * write into the next task's slot.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct rq_slot {
	struct ibv_mw *mw;
	void          *addr;
	uint32_t       len;
};

struct rq_broker {
	struct ibv_cq    *cq;
	struct ibv_qp    *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr    *inbox_mr;	/* LOCAL_WRITE | MW_BIND */
};

static int rq_wait_one(struct rq_broker *b)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(b->cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

int rq_expose(struct rq_broker *b, struct rq_slot *s, uint32_t *key_out)
{
	struct ibv_mw_bind_info bi = {
		.mr = b->inbox_mr,
		.addr = (uintptr_t)s->addr,
		.length = s->len,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	uint32_t key = s->mw->rkey;

	ibv_wr_start(b->qpx);
	b->qpx->wr_id = (uintptr_t)s;
	b->qpx->wr_flags = IBV_SEND_SIGNALED;
	// BUG: rdma-rkey-reuse -- 'key' is the window's current rkey, not ibv_inc_rkey() of it
	ibv_wr_bind_mw(b->qpx, s->mw, key, &bi); // BUG: rdma-local-mr-management -- the ULP binds a window per task
	if (ibv_wr_complete(b->qpx) || rq_wait_one(b))
		return -EIO;
	*key_out = key;
	return 0;
}

int rq_retire(struct rq_broker *b, struct rq_slot *s)
{
	ibv_wr_start(b->qpx);
	b->qpx->wr_id = (uintptr_t)s | 1;
	b->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(b->qpx, s->mw->rkey);
	if (ibv_wr_complete(b->qpx))
		return -EIO;
	/* OK: rdma-unmap-before-invalidate -- waits for the LOCAL_INV before the slot is reused */
	return rq_wait_one(b);
}
