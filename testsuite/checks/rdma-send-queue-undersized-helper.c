// RUN: %check_ulplint --kernel --check-suffixes=SMALL %s rdma-send-queue-undersized %t.small -- -- -DHLP_FACTOR=2
// RUN: %check_ulplint --kernel %s rdma-send-queue-undersized %t.ok -- -- -DHLP_FACTOR=3
// RUN: %check_ulplint --kernel --mode=plugin --check-suffixes=SMALL %s rdma-send-queue-undersized %t.plugin -- -- -DHLP_FACTOR=2

// The shape of nvme-rdma's I/O path: the command SEND is built in a post
// helper that links it behind whatever the caller passes
// (`req->mr ? &req->reg_wr.wr : NULL`), the REG_MR lives in the request,
// the LOCAL_INV is posted from the completion path, and the QP is created
// through the queue's cm_id but posted on as queue->qp. Three entries per
// request: the SMALL run reserves two (plus the drain entry), the other run
// three.

#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>
#include <linux/slab.h>

struct hlp_queue {
	struct rdma_cm_id *cm_id;
	struct ib_qp *qp;
	struct ib_pd *pd;
	int queue_size;
};

struct hlp_qe {
	struct ib_cqe cqe;
	u64 dma;
};

struct hlp_request {
	struct hlp_queue *queue;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_cqe reg_cqe;
	struct hlp_qe sqe;
	struct ib_sge sge;
};

int hlp_create_qp(struct hlp_queue *queue)
{
	struct ib_qp_init_attr init_attr = { };

	init_attr.qp_type = IB_QPT_RC;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.cap.max_send_wr = HLP_FACTOR * queue->queue_size + 1;
	// CHECK-MESSAGES-SMALL: :[[@LINE-1]]:2: warning: each request posts up to 3 WRs (REG_MR, SEND, LOCAL_INV) but max_send_wr is 2*queue->queue_size+1; with queue->queue_size requests in flight the send queue overflows and posts fail [rdma-send-queue-undersized]
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	return rdma_create_qp(queue->cm_id, queue->pd, &init_attr);
}

static int hlp_post_send(struct hlp_queue *queue, struct hlp_qe *qe,
			 struct ib_sge *sge, struct ib_send_wr *first)
{
	struct ib_send_wr wr;

	sge->addr = qe->dma;
	sge->length = 64;
	sge->lkey = queue->pd->local_dma_lkey;

	wr.next = NULL;
	wr.wr_cqe = &qe->cqe;
	wr.sg_list = sge;
	wr.num_sge = 1;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &wr;
	else
		first = &wr;
	return ib_post_send(queue->qp, first, NULL);
}

static int hlp_map(struct hlp_queue *queue, struct hlp_request *req,
		   struct scatterlist *sg, int count)
{
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	if (ib_map_mr_sg(req->mr, sg, count, NULL, SZ_4K) < count) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;
	return 0;
}

int hlp_queue_rq(struct hlp_queue *queue, struct hlp_request *req,
		 struct scatterlist *sg, int count)
{
	int err = hlp_map(queue, req, sg, count);

	if (err)
		return err;
	return hlp_post_send(queue, &req->sqe, &req->sge,
			     req->mr ? &req->reg_wr.wr : NULL);
}

int hlp_inv_rkey(struct hlp_queue *queue, struct hlp_request *req)
{
	struct ib_send_wr wr = {
		.opcode = IB_WR_LOCAL_INV,
		.next = NULL,
		.num_sge = 0,
		.send_flags = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	wr.wr_cqe = &req->reg_cqe;
	return ib_post_send(queue->qp, &wr, NULL);
}

void hlp_destroy(struct hlp_queue *queue)
{
	ib_drain_qp(queue->qp);
	rdma_destroy_qp(queue->cm_id);
}
