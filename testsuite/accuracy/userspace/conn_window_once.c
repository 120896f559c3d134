/*
 * mboxd: mailbox transport.  At connection setup each side exposes its
 * inbound mailbox to the peer through one type-2 memory window bound for
 * the whole life of the connection (the mailbox never moves); messages are
 * then RDMA WRITEs into the peer's mailbox followed by a small SEND that
 * rings the doorbell.  So per message: WRITE + SEND, and no registration or
 * invalidation work requests at all on the data path.
 *
 * This file is correct for every check:
 *  - the only bind happens once per connection, on a freshly allocated
 *    window, so there is no earlier key to rotate away from;
 *  - the 2 x depth send queue counts data work requests, not
 *    registrations, and matches WRITE + SEND per message;
 *  - the window dies with ibv_dealloc_mw() at disconnect, before the
 *    mailbox memory is freed;
 *  - each doorbell SEND is signaled.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MBOX_SIZE	(1u << 20)

struct mbox_conn {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	unsigned int        depth;
	char               *inbox;
	struct ibv_mr      *inbox_mr;	/* LOCAL_WRITE | MW_BIND, registered by the caller */
	struct ibv_mw      *inbox_mw;
	uint32_t            inbox_key;
	char               *outbox;
	struct ibv_mr      *outbox_mr;
	uint64_t            peer_addr;
	uint32_t            peer_key;
};

int mbox_create_qp(struct mbox_conn *c)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.pd = c->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
			      IBV_QP_EX_WITH_BIND_MW;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- WRITE + SEND per message; the one bind is at setup */
	attr.cap.max_send_wr = 2 * c->depth + 1;
	attr.cap.max_recv_wr = c->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 16;
	c->qp = ibv_create_qp_ex(c->ctx, &attr);
	if (!c->qp)
		return -errno;
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	return 0;
}

int mbox_expose_inbox(struct mbox_conn *c)
{
	struct ibv_mw_bind_info info = {
		.mr = c->inbox_mr,
		.addr = (uintptr_t)c->inbox,
		.length = MBOX_SIZE,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	struct ibv_wc wc;
	int n;

	c->inbox_mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- window allocated by the ULP to expose the mailbox
	if (!c->inbox_mw)
		return -errno;
	c->inbox_key = c->inbox_mw->rkey;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = 0;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* OK: rdma-rkey-reuse -- the first and only bind of a freshly allocated window */
	ibv_wr_bind_mw(c->qpx, c->inbox_mw, c->inbox_key, &info); // BUG: rdma-local-mr-management -- the ULP binds the window itself
	if (ibv_wr_complete(c->qpx))
		goto err;
	do
		n = ibv_poll_cq(c->cq, 1, &wc);
	while (n == 0);
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		goto err;
	return 0;
err:
	/* OK: rdma-mr-leak -- the window is released when the bind fails */
	ibv_dealloc_mw(c->inbox_mw);
	c->inbox_mw = NULL;
	return -EIO;
}

int mbox_send(struct mbox_conn *c, uint64_t off, uint32_t len, uint64_t seq)
{
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = seq;
	c->qpx->wr_flags = 0;
	ibv_wr_rdma_write(c->qpx, c->peer_key, c->peer_addr + off);
	ibv_wr_set_sge(c->qpx, c->outbox_mr->lkey, (uintptr_t)(c->outbox + off), len);
	c->qpx->wr_id = seq;
	/* OK: rdma-unsignaled-send-starvation -- the doorbell is signaled and retires the WRITE */
	c->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(c->qpx);
	ibv_wr_set_inline_data(c->qpx, &seq, sizeof(seq));
	return ibv_wr_complete(c->qpx);
}

void mbox_disconnect(struct mbox_conn *c)
{
	ibv_destroy_qp(c->qp);
	if (c->inbox_mw)
		ibv_dealloc_mw(c->inbox_mw);
	/* OK: rdma-invalidation-leak -- the window was deallocated (invalidated) first */
	free(c->inbox);
}
