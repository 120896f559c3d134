// RUN: %check_ulplint --kernel --check-suffixes=NEVER %s rdma-unsignaled-send-starvation %t.never -- -- -DDEMO_NEVER
// RUN: %check_ulplint --kernel %s rdma-unsignaled-send-starvation %t.ok

// Kernel: IB_SIGNAL_REQ_WR with a chain whose last WR is never signaled
// (NEVER); the default run signals through rdma_rw's cqe and the chained
// response, and sq_sig_type unset means IB_SIGNAL_ALL_WR.

#include <rdma/rw.h>

struct demo_rsp {
	struct ib_send_wr send_wr;
	struct ib_sge sge;
	struct ib_cqe cqe;
	struct rdma_rw_ctx rw;
};

struct demo_queue {
	struct rdma_cm_id *cm_id;
	struct ib_qp *qp;
	u32 port_num;
	int depth;
};

static int demo_create(struct demo_queue *q, struct ib_pd *pd)
{
	struct ib_qp_init_attr attr = {};

	attr.qp_type = IB_QPT_RC;
	attr.cap.max_send_wr = q->depth + 1;
	attr.cap.max_rdma_ctxs = q->depth;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	// CHECK-MESSAGES-NEVER: :[[@LINE-1]]:2: warning: only work requests that ask for it are signaled on this QP, but no post on it sets IB_SEND_SIGNALED
	attr.port_num = q->port_num;
	return rdma_create_qp(q->cm_id, pd, &attr);
}

static int demo_queue_response(struct demo_queue *q, struct demo_rsp *rsp,
			       bool with_data)
{
	rsp->send_wr.opcode = IB_WR_SEND;
	rsp->send_wr.sg_list = &rsp->sge;
	rsp->send_wr.num_sge = 1;
	rsp->send_wr.next = NULL;
#ifdef DEMO_NEVER
	rsp->send_wr.send_flags = 0;
	return ib_post_send(q->qp, &rsp->send_wr, NULL);
#else
	rsp->send_wr.send_flags = IB_SEND_SIGNALED;
	if (with_data)
		return rdma_rw_ctx_post(&rsp->rw, q->qp, q->port_num, NULL,
					&rsp->send_wr);
	return ib_post_send(q->qp, &rsp->send_wr, NULL);
#endif
}
