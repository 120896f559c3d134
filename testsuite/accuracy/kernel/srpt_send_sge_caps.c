// SPDX-License-Identifier: GPL-2.0-only
/*
 * srptx: channel creation of an SRP target, in the shape of
 * drivers/infiniband/ulp/srpt/ib_srpt.c srpt_create_ch_ib() of the 4.x
 * series, when the number of send SGEs per work request was the constant
 * SRPT_DEF_SG_PER_WQE; later kernels clamp it to the device's
 * attrs.max_send_sge. Written fresh for the held-out batch.
 *
 * Data moves with the rdma_rw API: the QP declares max_rdma_ctxs, the core
 * sizes and clamps the send queue, and each response SEND is chained
 * behind the context's RDMA WRITEs and signaled.
 *
 * Findings: 16 send SGEs requested without looking at attrs.max_send_sge
 * (the QP cannot be created on devices with fewer, e.g. many iWARP and
 * software devices). Correct: max_send_wr (clamped by rdma_rw_init_qp()
 * because max_rdma_ctxs is set, and by the explicit min() too) and the
 * receive queue depth, clamped to attrs.max_qp_wr when the channel is
 * created.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/module.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define SRPT_DEF_SG_PER_WQE	16
#define MAX_SRPT_RQ_SIZE	4096
#define DEF_SRPT_SQ_SIZE	4096

static int srptx_sq_size = DEF_SRPT_SQ_SIZE;
module_param(srptx_sq_size, int, 0444);
MODULE_PARM_DESC(srptx_sq_size, "Per-channel send queue (SQ) size.");

struct srptx_device {
	struct ib_device	*device;
	struct ib_pd		*pd;
};

struct srptx_port {
	struct srptx_device	*sdev;
	u8			port;
};

struct srptx_rdma_ch {
	struct srptx_port	*sport;
	struct rdma_cm_id	*rdma_cm_id;
	struct ib_cq		*cq;
	int			cq_size;
	struct ib_qp		*qp;
	int			rq_size;
	int			sq_wr_avail;
};

struct srptx_send_ioctx {
	struct rdma_rw_ctx	rw;
	struct scatterlist	*sg;
	unsigned int		sg_cnt;
	struct ib_cqe		cqe;
	struct ib_sge		sge;
};

/**
 * srptx_create_ch_ib - create the queue pair of a new channel
 * @ch: the channel
 */
int srptx_create_ch_ib(struct srptx_rdma_ch *ch)
{
	struct srptx_port *sport = ch->sport;
	struct srptx_device *sdev = sport->sdev;
	const struct ib_device_attr *attrs = &sdev->device->attrs;
	int sq_size = srptx_sq_size;
	struct ib_qp_init_attr *qp_init;
	int ret;

	ch->rq_size = min(MAX_SRPT_RQ_SIZE, attrs->max_qp_wr);

	qp_init = kzalloc(sizeof(*qp_init), GFP_KERNEL);
	if (!qp_init)
		return -ENOMEM;

	ch->cq_size = ch->rq_size + sq_size;
	ch->cq = ib_cq_pool_get(sdev->device, ch->cq_size, -1,
				IB_POLL_WORKQUEUE);
	if (IS_ERR(ch->cq)) {
		ret = PTR_ERR(ch->cq);
		goto out;
	}

	qp_init->qp_context = (void *)ch;
	qp_init->send_cq = ch->cq;
	qp_init->recv_cq = ch->cq;
	qp_init->sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_init->qp_type = IB_QPT_RC;
	/* OK: rdma-queue-cap-unchecked -- clamped to max_qp_wr here, and by rdma_rw_init_qp() since max_rdma_ctxs is set */
	qp_init->cap.max_send_wr = min(sq_size / 2, attrs->max_qp_wr);
	qp_init->cap.max_rdma_ctxs = sq_size / 2;
	/* BUG: rdma-queue-cap-unchecked -- 16 send SGEs are requested without comparing with attrs.max_send_sge */
	qp_init->cap.max_send_sge = SRPT_DEF_SG_PER_WQE;
	qp_init->port_num = sport->port;
	/* OK: rdma-queue-cap-unchecked -- rq_size was clamped to attrs.max_qp_wr above */
	qp_init->cap.max_recv_wr = ch->rq_size;
	qp_init->cap.max_recv_sge = 1;

	ret = rdma_create_qp(ch->rdma_cm_id, sdev->pd, qp_init);
	if (ret) {
		pr_err("failed to create queue pair (%d)\n", ret);
		goto err_put_cq;
	}
	ch->qp = ch->rdma_cm_id->qp;
	ch->sq_wr_avail = qp_init->cap.max_send_wr;
	kfree(qp_init);
	return 0;

err_put_cq:
	ib_cq_pool_put(ch->cq, ch->cq_size);
out:
	kfree(qp_init);
	return ret;
}

static void srptx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srptx_send_ioctx *ioctx =
		container_of(wc->wr_cqe, struct srptx_send_ioctx, cqe);

	if (wc->status != IB_WC_SUCCESS)
		pr_info("sending response for ioctx %p failed with status %d\n",
			ioctx, wc->status);
}

/**
 * srptx_queue_response - write data-in and send the SRP response
 * @ch: the channel
 * @ioctx: the command context, rw context already initialised
 * @rsp_dma: DMA address of the response IU
 * @rsp_len: its length
 */
int srptx_queue_response(struct srptx_rdma_ch *ch,
			 struct srptx_send_ioctx *ioctx,
			 u64 rsp_dma, u32 rsp_len)
{
	struct ib_send_wr send_wr, *first_wr = &send_wr;

	ioctx->sge.addr = rsp_dma;
	ioctx->sge.length = rsp_len;
	ioctx->sge.lkey = ch->sport->sdev->pd->local_dma_lkey;

	ioctx->cqe.done = srptx_send_done;
	send_wr.next = NULL;
	send_wr.wr_cqe = &ioctx->cqe;
	send_wr.sg_list = &ioctx->sge;
	send_wr.num_sge = 1;
	send_wr.opcode = IB_WR_SEND;
	send_wr.send_flags = IB_SEND_SIGNALED;

	if (ioctx->sg_cnt)
		first_wr = rdma_rw_ctx_wrs(&ioctx->rw, ch->qp,
					   ch->sport->port, NULL, first_wr);

	return ib_post_send(ch->qp, first_wr, NULL);
}
