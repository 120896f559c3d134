/*
 * rndv_proto.c: QP setup and protocol steps of the PUT rendezvous.
 *
 * The QP signals requested work requests only.  The payload WRITE posted
 * here is unsignaled; it is retired by the FIN, which goes out through
 * rndv_post_ctrl() in rndv_progress.c, where every RNDV_SIG_EVERY-th
 * control message is signaled.
 *
 * Not correct: the receiver registers each receive buffer per message (a
 * registration cache keyed by buffer would do, as the sender side does),
 * and when posting the CTS fails the handler returns with the fresh MR
 * still registered in r->mr.
 */
#include "rndv.h"

#include <errno.h>
#include <string.h>

int rndv_ep_create_qp(struct rndv_ep *ep)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = RNDV_SQ_DEPTH;
	attr.cap.max_recv_wr = RNDV_SQ_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- rndv_post_ctrl() (rndv_progress.c) signals every RNDV_SIG_EVERY-th post */
	attr.sq_sig_all = 0;
	ep->qp = ibv_create_qp(ep->pd, &attr);
	return ep->qp ? 0 : -errno;
}

int rndv_handle_rts(struct rndv_ep *ep, const struct rndv_msg *rts, struct rndv_rreq *r)
{
	struct rndv_msg cts;

	if (rts->len > r->len)
		return -EMSGSIZE;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE with REMOTE_WRITE */
	// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the receive buffer is registered for every message
	r->mr = ibv_reg_mr(ep->pd, r->buf, rts->len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!r->mr)
		return -errno;
	memset(&cts, 0, sizeof(cts));
	cts.type = RNDV_CTS;
	cts.tag = rts->tag;
	cts.sreq = rts->sreq;
	cts.rreq = (uintptr_t)r;
	cts.addr = (uintptr_t)r->buf;
	cts.rkey = r->mr->rkey;
	cts.len = rts->len;
	if (rndv_post_ctrl(ep, &cts))
		return -EIO; // BUG: rdma-mr-leak -- r->mr stays registered on this error return
	return 0;
}

static struct ibv_mr *rndv_src_mr(struct rndv_ep *ep, const void *buf, size_t len)
{
	struct rndv_src_ent *e, *victim = &ep->src_cache[0];
	int i;

	for (i = 0; i < RNDV_SRC_CACHE; i++) {
		e = &ep->src_cache[i];
		if (e->mr && e->buf == buf && e->len >= len)
			return e->mr;
		if (!e->mr)
			victim = e;
	}
	if (victim->mr)
		ibv_dereg_mr(victim->mr);	/* OK: rdma-registration-in-datapath -- cache replacement */
	victim->buf = buf;
	victim->len = len;
	/* OK: rdma-registration-in-datapath -- registration cache, kept for later sends from the same buffer */
	victim->mr = ibv_reg_mr(ep->pd, (void *)buf, len, 0); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITE
	return victim->mr;
}

int rndv_handle_cts(struct rndv_ep *ep, const struct rndv_msg *cts)
{
	struct rndv_sreq *s = (struct rndv_sreq *)(uintptr_t)cts->sreq;
	struct ibv_mr *mr = rndv_src_mr(ep, s->buf, s->len);
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct rndv_msg fin;

	if (!mr)
		return -errno;
	sge.addr = (uintptr_t)s->buf;
	sge.length = cts->len;
	sge.lkey = mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = cts->addr;
	wr.wr.rdma.rkey = cts->rkey;
	if (ibv_post_send(ep->qp, &wr, &bad))
		return -EIO;
	memset(&fin, 0, sizeof(fin));
	fin.type = RNDV_FIN;
	fin.rreq = cts->rreq;
	s->done = 1;
	return rndv_post_ctrl(ep, &fin);
}
