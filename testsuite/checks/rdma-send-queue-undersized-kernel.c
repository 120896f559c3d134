// RUN: %check_ulplint --kernel --check-suffixes=FACTOR %s rdma-send-queue-undersized %t.factor -- -- -DDEMO_FACTOR=2 -DDEMO_EXTRA=1
// RUN: %check_ulplint --kernel --check-suffixes=DRAIN %s rdma-send-queue-undersized %t.drain -- -- -DDEMO_FACTOR=3 -DDEMO_EXTRA=0
// RUN: %check_ulplint --kernel %s rdma-send-queue-undersized %t.ok -- -- -DDEMO_FACTOR=3 -DDEMO_EXTRA=1
// RUN: %check_ulplint --kernel --mode=plugin --check-suffixes=FACTOR %s rdma-send-queue-undersized %t.plugin -- -- -DDEMO_FACTOR=2 -DDEMO_EXTRA=1

// A hand-managed initiator: each request posts REG_MR chained before its
// SEND, and the completion path posts LOCAL_INV. FACTOR sizes the queue for
// two WRs per request; DRAIN forgets ib_drain_qp()'s entry; the third run is
// correct (3 per request + 1) and reports nothing.

#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>
#include <linux/slab.h>

struct demo_queue {
	struct rdma_cm_id *cm_id;
	struct ib_qp *qp;
	int queue_size;
};

struct demo_request {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr send_wr;
	struct ib_send_wr inv_wr;
	struct ib_sge sge;
	struct ib_cqe cqe;
};

static int demo_create_qp(struct demo_queue *queue, struct ib_pd *pd)
{
	struct ib_qp_init_attr init_attr = {
		.qp_type = IB_QPT_RC,
		.sq_sig_type = IB_SIGNAL_REQ_WR,
	};

	init_attr.cap.max_send_wr = DEMO_FACTOR * queue->queue_size + DEMO_EXTRA;
	// CHECK-MESSAGES-FACTOR: :[[@LINE-1]]:2: warning: each request posts up to 3 WRs (REG_MR, SEND, LOCAL_INV) but max_send_wr is 2*queue->queue_size+DEMO_EXTRA; with queue->queue_size requests in flight the send queue overflows and posts fail [rdma-send-queue-undersized]
	// CHECK-MESSAGES-FACTOR: note: work request built here
	// CHECK-MESSAGES-DRAIN: :[[@LINE-3]]:2: warning: max_send_wr is 3*queue->queue_size+DEMO_EXTRA, exactly the 3 per request for queue->queue_size requests, and leaves no entry for ib_drain_qp(): on a full send queue it cannot post its drain work request, warns and returns without draining, and the QP is destroyed with work requests in flight [rdma-send-queue-undersized]
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	return rdma_create_qp(queue->cm_id, pd, &init_attr);
}

static void demo_build_reg(struct demo_request *req)
{
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.send_flags = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	req->reg_wr.wr.next = &req->send_wr;
}

static int demo_submit(struct demo_queue *queue, struct demo_request *req)
{
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.sg_list = &req->sge;
	req->send_wr.num_sge = 1;
	req->send_wr.send_flags = IB_SEND_SIGNALED;
	req->send_wr.next = NULL;
	if (req->mr) {
		demo_build_reg(req);
		return ib_post_send(queue->qp, &req->reg_wr.wr, NULL);
	}
	return ib_post_send(queue->qp, &req->send_wr, NULL);
}

static int demo_complete(struct demo_queue *queue, struct demo_request *req)
{
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.wr_cqe = &req->cqe;
	req->inv_wr.next = NULL;
	return ib_post_send(queue->qp, &req->inv_wr, NULL);
}

static void demo_teardown(struct demo_queue *queue)
{
	ib_drain_qp(queue->qp);
	rdma_destroy_qp(queue->cm_id);
}
