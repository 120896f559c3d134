/*
 * blkc_queue.c - controller setup and I/O queue life cycle.
 *
 * The I/O queue's send queue is sized for the BIND_MW and the command SEND
 * of each request only, on the assumption that the target always
 * invalidates remotely; blkc_io.c posts a LOCAL_INV whenever it does not.
 * The receive queue is always sized for the largest queue depth.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include "blkc.h"

int blkc_post_rsp(struct blkc_queue *q, unsigned i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&q->rsps[i],
		.length = sizeof(q->rsps[i]),
		.lkey = q->rsp_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(q->qp, &wr, &bad);
}

static int blkc_alloc_reqs(struct blkc_ctrl *ctrl, struct blkc_queue *q)
{
	unsigned i;

	q->reqs = calloc(q->depth, sizeof(*q->reqs));
	if (!q->reqs)
		return -ENOMEM;
	for (i = 0; i < q->depth; i++) {
		struct blkc_req *req = &q->reqs[i];

		req->mw = ibv_alloc_mw(ctrl->pd, IBV_MW_TYPE_2);
		if (!req->mw)
			goto unwind;
		req->q = q;
		req->tag = i;
		req->rkey = req->mw->rkey;
		req->next_free = q->free_reqs;
		q->free_reqs = req;
	}
	return 0;

unwind:
	while (i--)
		ibv_dealloc_mw(q->reqs[i].mw);
	free(q->reqs);
	q->reqs = NULL;
	return -ENOMEM;
}

static int blkc_alloc_rings(struct blkc_ctrl *ctrl, struct blkc_queue *q)
{
	q->nr_rsps = q->depth + 1;	/* one spare for async events */
	q->cmds = calloc(q->depth, sizeof(*q->cmds));
	q->rsps = calloc(q->nr_rsps, sizeof(*q->rsps));
	if (!q->cmds || !q->rsps)
		goto err;
	/* OK: rdma-registration-in-datapath -- command and response rings are registered once per queue */
	q->cmd_mr = ibv_reg_mr(ctrl->pd, q->cmds, q->depth * sizeof(*q->cmds), 0);
	if (!q->cmd_mr)
		goto err;
	q->rsp_mr = ibv_reg_mr(ctrl->pd, q->rsps, q->nr_rsps * sizeof(*q->rsps),
			       IBV_ACCESS_LOCAL_WRITE);
	if (!q->rsp_mr)
		goto err_cmd;
	return 0;

err_cmd:
	ibv_dereg_mr(q->cmd_mr);
err:
	free(q->cmds);
	free(q->rsps);
	return -ENOMEM;
}

int blkc_queue_create(struct blkc_ctrl *ctrl, struct blkc_queue *q,
		      struct rdma_cm_id *id, unsigned depth)
{
	struct ibv_qp_init_attr init;
	unsigned i;
	int ret;

	q->ctrl = ctrl;
	q->cm_id = id;
	q->depth = depth;
	q->cq = ibv_create_cq(ctrl->verbs, 3 * depth + BLKC_MAX_QUEUE_DEPTH + 1, q, NULL, 0);
	if (!q->cq)
		return -ENOMEM;

	memset(&init, 0, sizeof(init));
	init.qp_context = q;
	init.send_cq = q->cq;
	init.recv_cq = q->cq;
	init.qp_type = IBV_QPT_RC;
	init.sq_sig_all = 0;
	/* BUG(program): rdma-send-queue-undersized -- each request posts BIND_MW + SEND and, when the target does not invalidate, a LOCAL_INV: 3 per request, 2 reserved */
	init.cap.max_send_wr = 2 * q->depth + 1;
	/* BUG(file): rdma-queue-cap-unchecked -- 2049 receives requested without looking at max_qp_wr */
	init.cap.max_recv_wr = BLKC_MAX_QUEUE_DEPTH + 1;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = sizeof(struct blkc_cmd);
	ret = rdma_create_qp(id, ctrl->pd, &init);
	if (ret)
		goto err_cq;
	q->qp = id->qp;

	ret = blkc_alloc_reqs(ctrl, q);
	if (ret)
		goto err_qp;
	ret = blkc_alloc_rings(ctrl, q);
	if (ret)
		goto err_reqs;
	for (i = 0; i < q->nr_rsps; i++) {
		ret = blkc_post_rsp(q, i);
		if (ret)
			goto err_rings;
	}
	return 0;

err_rings:
	ibv_dereg_mr(q->rsp_mr);
	ibv_dereg_mr(q->cmd_mr);
	free(q->cmds);
	free(q->rsps);
err_reqs:
	for (i = 0; i < q->depth; i++)
		ibv_dealloc_mw(q->reqs[i].mw);
	free(q->reqs);
err_qp:
	rdma_destroy_qp(id);
err_cq:
	ibv_destroy_cq(q->cq);
	return ret ? ret : -EINVAL;
}

void blkc_queue_destroy(struct blkc_queue *q)
{
	unsigned i;

	rdma_destroy_qp(q->cm_id);
	for (i = 0; i < q->depth; i++)
		ibv_dealloc_mw(q->reqs[i].mw);
	ibv_dereg_mr(q->rsp_mr);
	ibv_dereg_mr(q->cmd_mr);
	free(q->reqs);
	free(q->cmds);
	free(q->rsps);
	ibv_destroy_cq(q->cq);
}

int blkc_ctrl_setup(struct blkc_ctrl *ctrl, struct rdma_cm_id *aq_id,
		    struct rdma_cm_id **io_ids)
{
	unsigned i, depth;
	int ret;

	ctrl->verbs = aq_id->verbs;
	if (ibv_query_device(ctrl->verbs, &ctrl->dev_attr))
		return -errno;
	if (!(ctrl->dev_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B)) {
		fprintf(stderr, "blkc: %s has no type 2B memory windows\n",
			ibv_get_device_name(ctrl->verbs->device));
		return -EOPNOTSUPP;
	}
	depth = ctrl->opts.queue_depth;
	if (depth > BLKC_MAX_QUEUE_DEPTH)
		depth = BLKC_MAX_QUEUE_DEPTH;
	if ((unsigned)ctrl->dev_attr.max_mw < depth * ctrl->opts.nr_io_queues + BLKC_AQ_DEPTH)
		return -ENOSPC;

	ctrl->pd = ibv_alloc_pd(ctrl->verbs);
	if (!ctrl->pd)
		return -ENOMEM;
	ctrl->pool = aligned_alloc(4096, BLKC_POOL_SZ);
	if (!ctrl->pool)
		goto err_pd;
	/* OK: rdma-access-flags-invalid -- windows bound over the pool may be REMOTE_WRITE: the pool has LOCAL_WRITE and MW_BIND */
	ctrl->pool_mr = ibv_reg_mr(ctrl->pd, ctrl->pool, BLKC_POOL_SZ,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!ctrl->pool_mr)
		goto err_pool;

	ret = blkc_aq_create(ctrl, aq_id);
	if (ret)
		goto err_mr;
	for (i = 0; i < ctrl->opts.nr_io_queues; i++) {
		ret = blkc_queue_create(ctrl, &ctrl->queues[i], io_ids[i], depth);
		if (ret)
			goto err_queues;
		ctrl->queues[i].qid = i + 1;
	}
	return 0;

err_queues:
	while (i--)
		blkc_queue_destroy(&ctrl->queues[i]);
err_mr:
	ibv_dereg_mr(ctrl->pool_mr);
err_pool:
	free(ctrl->pool);
err_pd:
	ibv_dealloc_pd(ctrl->pd);
	return -ENOMEM;
}
