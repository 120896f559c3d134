/*
 * rndv_progress.c: control-message posting and completion dispatch of the
 * PUT rendezvous.  Control messages are copied into a ring registered once
 * (LOCAL_WRITE); every RNDV_SIG_EVERY-th one is signaled, the counter is
 * advanced on each post.
 *
 * Correct: the FIN handler deregisters the per-message receive MR, which
 * kills the key the CTS carried (that the MR exists per message at all is
 * reported where it is registered, in rndv_proto.c; its deregistration
 * here is the other half of the same per-I/O registration).
 */
#include "rndv.h"

#include <errno.h>
#include <string.h>

int rndv_post_ctrl(struct rndv_ep *ep, const struct rndv_msg *m)
{
	struct rndv_msg *slot = &ep->ctrl[ep->ctrl_head++ % RNDV_SQ_DEPTH];
	struct ibv_sge sge = { (uintptr_t)slot, sizeof(*slot), ep->ctrl_mr->lkey };
	struct ibv_send_wr wr, *bad;

	*slot = *m;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (++ep->unsignaled >= RNDV_SIG_EVERY) {
		wr.send_flags = IBV_SEND_SIGNALED;
		ep->unsignaled = 0;
	}
	return ibv_post_send(ep->qp, &wr, &bad) ? -EIO : 0;
}

void rndv_handle_fin(struct rndv_ep *ep, const struct rndv_msg *fin)
{
	struct rndv_rreq *r = (struct rndv_rreq *)(uintptr_t)fin->rreq;

	(void)ep;
	/* OK: rdma-invalidation-leak -- deregistration kills the key sent in the CTS */
	ibv_dereg_mr(r->mr); // BUG: rdma-registration-in-datapath -- per-message deregistration on the completion path
	r->mr = NULL;
	r->done = 1;
}

void rndv_progress(struct rndv_ep *ep, struct rndv_msg *rx_ring, struct rndv_rreq *posted_rreq)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(ep->cq, 16, wc);
	for (i = 0; i < n; i++) {
		struct rndv_msg *m;

		if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV)
			continue;
		m = &rx_ring[wc[i].wr_id];
		switch (m->type) {
		case RNDV_RTS:
			rndv_handle_rts(ep, m, posted_rreq);
			break;
		case RNDV_CTS:
			rndv_handle_cts(ep, m);
			break;
		case RNDV_FIN:
			rndv_handle_fin(ep, m);
			break;
		}
	}
}
