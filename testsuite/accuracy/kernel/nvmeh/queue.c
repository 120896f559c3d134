// SPDX-License-Identifier: GPL-2.0
/*
 * nvh queue.c: device and queue setup (see nvmeh.h).
 *
 * The send queue reserves two entries per request ("MR, SEND") plus one for
 * the drain. But io.c also posts a LOCAL_INV for every request whose key the
 * controller did not invalidate remotely, so a request can hold three
 * entries until its completions are reaped: under load the LOCAL_INV post
 * fails. The factor is hand-made as well. The PD has no global rkey.
 */
#include "nvmeh.h"

int nvh_create_device(struct nvh_device *ndev, struct ib_device *ibdev)
{
	ndev->dev = ibdev;
	/* OK: rdma-remote-access-overbroad -- registration is always used; the PD has no global rkey */
	ndev->pd = ib_alloc_pd(ibdev, 0);
	if (IS_ERR(ndev->pd))
		return PTR_ERR(ndev->pd);
	return 0;
}

int nvh_create_queue_ib(struct nvh_queue *queue)
{
	struct nvh_device *dev = queue->device;
	struct ib_qp_init_attr init_attr;
	const int send_wr_factor = 2;	/* MR, SEND */
	int ret;

	queue->cq_size = (send_wr_factor + 1) * queue->queue_size + 1;
	queue->ib_cq = ib_cq_pool_get(dev->dev, queue->cq_size, 0,
				      IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->ib_cq))
		return PTR_ERR(queue->ib_cq);

	memset(&init_attr, 0, sizeof(init_attr));
	/* +1 for ib_drain_qp */
	/* BUG(program): rdma-send-queue-undersized -- io.c posts REG_MR, SEND and LOCAL_INV for one request, three entries, against two reserved */
	init_attr.cap.max_send_wr = send_wr_factor * queue->queue_size + 1; /* BUG: rdma-send-queue-manual-factor -- the depth times a hand-made registration factor */
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;
	init_attr.qp_context = queue;

	queue->qp = ib_create_qp(dev->pd, &init_attr);
	if (IS_ERR(queue->qp)) {
		ret = PTR_ERR(queue->qp);
		goto out_put_cq;
	}

	/* BUG: rdma-local-mr-management -- the host keeps its own MR pool */
	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->queue_size,
			      IB_MR_TYPE_MEM_REG, NVH_MAX_SEGMENTS, 0);
	if (ret)
		goto out_destroy_qp;
	return 0;

out_destroy_qp:
	ib_destroy_qp(queue->qp);
out_put_cq:
	ib_cq_pool_put(queue->ib_cq, queue->cq_size);
	return ret;
}

void nvh_destroy_queue_ib(struct nvh_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	ib_destroy_qp(queue->qp);
	ib_cq_pool_put(queue->ib_cq, queue->cq_size);
}

int nvh_alloc_io_queues(struct nvh_ctrl *ctrl)
{
	int i, ret;

	for (i = 1; i < ctrl->queue_count; i++) {
		struct nvh_queue *queue = &ctrl->queues[i];

		queue->device = ctrl->device;
		queue->queue_size = ctrl->sqsize + 1;
		queue->ctrl = ctrl;
		ret = nvh_create_queue_ib(queue);
		if (ret)
			goto out_free_queues;
	}
	return 0;

out_free_queues:
	for (i--; i >= 1; i--)
		nvh_destroy_queue_ib(&ctrl->queues[i]);
	return ret;
}

void nvh_free_io_queues(struct nvh_ctrl *ctrl)
{
	int i;

	for (i = 1; i < ctrl->queue_count; i++)
		nvh_destroy_queue_ib(&ctrl->queues[i]);
}
