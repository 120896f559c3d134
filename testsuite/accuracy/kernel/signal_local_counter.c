// SPDX-License-Identifier: GPL-2.0
/*
 * evs: the event-stream sender of an invented monitoring transport ("evs").
 * Events are SENT to a collector; to save completions only every
 * EVS_SIGNAL_EVERY-th SEND is signaled.
 *
 * The bug: the counter is a local variable of evs_post_event(), initialised
 * to zero on every call, so "++since_signal == EVS_SIGNAL_EVERY" is never
 * true and no SEND is ever signaled; the send queue fills after max_send_wr
 * events. (The counter is advanced, just never across calls.) The queue is
 * sized from the device limit.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

#define EVS_SIGNAL_EVERY	32

struct evs_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	struct ib_cqe		send_cqe;
};

static void evs_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("evs: send failed: %s\n", ib_wc_status_msg(wc->status));
}

int evs_create_qp(struct evs_conn *c)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.cap.max_send_wr = min_t(u32, 4096, c->ibdev->attrs.max_qp_wr); /* OK: rdma-queue-cap-unchecked -- 4096 is clamped to the device's max_qp_wr */
	attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->send_cqe.done = evs_send_done;

	c->qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->qp))
		return PTR_ERR(c->qp);
	return 0;
}

int evs_post_event(struct evs_conn *c, u64 dma, u32 len)
{
	unsigned int since_signal = 0;
	struct ib_send_wr wr = { };
	struct ib_sge sge;

	sge.addr = dma;
	sge.length = len;
	sge.lkey = c->pd->local_dma_lkey;
	wr.wr_cqe = &c->send_cqe;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;

	/* BUG: rdma-unsignaled-send-starvation -- since_signal is a fresh local on every call and never reaches EVS_SIGNAL_EVERY; no SEND is ever signaled */
	if (++since_signal == EVS_SIGNAL_EVERY) {
		wr.send_flags = IB_SEND_SIGNALED;
		since_signal = 0;
	}
	return ib_post_send(c->qp, &wr, NULL);
}

struct evs_ack {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	u64			dma;
};

static void evs_ack_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_warn("evs: collector ack lost: %s\n",
			ib_wc_status_msg(wc->status));
}

int evs_post_ack_buf(struct evs_conn *c, struct evs_ack *ack)
{
	ack->cqe.done = evs_ack_done;
	ack->sge.addr = ack->dma;
	ack->sge.length = 8;
	ack->sge.lkey = c->pd->local_dma_lkey;
	ack->wr.next = NULL;
	ack->wr.wr_cqe = &ack->cqe;
	ack->wr.sg_list = &ack->sge;
	ack->wr.num_sge = 1;
	return ib_post_recv(c->qp, &ack->wr, NULL);
}

void evs_close(struct evs_conn *c)
{
	ib_destroy_qp(c->qp);
	ib_free_cq(c->cq);
}
