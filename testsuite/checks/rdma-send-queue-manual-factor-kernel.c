// RUN: %check_ulplint --kernel %s rdma-send-queue-manual-factor %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-send-queue-manual-factor %t.plugin
// RUN: %check_ulplint --kernel --check-suffixes=NOTES %s rdma-send-queue-manual-factor %t.notes -- --fix-notes

// nvme-rdma host's queue sizing: factor * queue_size + 1 with factor 3 for
// REG_MR, SEND and LOCAL_INV. The fix-it is attached to a note: only
// --fix-notes applies it (the NOTES run).

#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>
#include <linux/slab.h>

struct demo_queue {
	struct rdma_cm_id *cm_id;
	struct ib_qp *qp;
	struct ib_cq *ib_cq;
	int queue_size;
};

struct demo_request {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr;
	struct ib_cqe reg_cqe;
	struct ib_cqe inv_cqe;
	struct ib_sge sge[2];
	int num_sge;
};

static void demo_done(struct ib_cq *cq, struct ib_wc *wc) {}

static int demo_create_qp(struct demo_queue *queue, struct ib_pd *pd,
			  const int factor)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	/* +1 for drain */
	init_attr.cap.max_send_wr = factor * queue->queue_size + 1;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: max_send_wr multiplies the queue depth 'queue->queue_size' by a hand-made factor '3' for registration and invalidation work requests; let the core size it: set cap.max_rdma_ctxs and register through rdma_rw_ctx_*() (rdma_rw_init_qp() adds the registration WRs per context) [rdma-send-queue-manual-factor]
	// CHECK-MESSAGES: :[[@LINE-2]]:2: note: size the queue through cap.max_rdma_ctxs
	// CHECK-MESSAGES-NOTES: :[[@LINE-3]]:2: warning: max_send_wr multiplies the queue depth
	// CHECK-FIXES-NOTES: init_attr.cap.max_send_wr = queue->queue_size + 1;
	// CHECK-FIXES-NOTES-NEXT: init_attr.cap.max_rdma_ctxs = queue->queue_size;
	// CHECK-FIXES: init_attr.cap.max_send_wr = factor * queue->queue_size + 1;
	/* +1 for drain */
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 2;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;

	ret = rdma_create_qp(queue->cm_id, pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

static int demo_create_queue_ib(struct demo_queue *queue, struct ib_pd *pd)
{
	const int send_wr_factor = 3;	/* MR, SEND, INV */

	return demo_create_qp(queue, pd, send_wr_factor);
}

static int demo_map_sg_fr(struct demo_queue *queue, struct demo_request *req,
			  struct scatterlist *sgl, int count)
{
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	if (ib_map_mr_sg(req->mr, sgl, count, NULL, SZ_4K) < count) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_cqe.done = demo_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;
	return 0;
}

static int demo_post_send(struct demo_queue *queue, struct ib_cqe *cqe,
			  struct ib_sge *sge, u32 num_sge,
			  struct ib_send_wr *first)
{
	struct ib_send_wr wr;

	wr.next       = NULL;
	wr.wr_cqe     = cqe;
	wr.sg_list    = sge;
	wr.num_sge    = num_sge;
	wr.opcode     = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &wr;
	else
		first = &wr;

	return ib_post_send(queue->qp, first, NULL);
}

static int demo_queue_rq(struct demo_queue *queue, struct demo_request *req,
			 struct ib_cqe *cqe)
{
	return demo_post_send(queue, cqe, req->sge, req->num_sge,
			      req->mr ? &req->reg_wr.wr : NULL);
}

static int demo_inv_rkey(struct demo_queue *queue, struct demo_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = demo_done;
	wr.wr_cqe = &req->inv_cqe;
	return ib_post_send(queue->qp, &wr, NULL);
}

static void demo_destroy_queue(struct demo_queue *queue)
{
	ib_drain_qp(queue->qp);
	rdma_destroy_qp(queue->cm_id);
}
