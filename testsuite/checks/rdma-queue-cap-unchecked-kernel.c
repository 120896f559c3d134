// RUN: %check_ulplint --kernel %s rdma-queue-cap-unchecked %t

// Kernel: a constant receive queue beyond the portable floor; the send
// queue is declared through max_rdma_ctxs, which rdma_rw clamps itself.

#include <rdma/rdma_cm.h>

#define DEMO_RECV_DTOS 4096

struct demo_conn {
	struct rdma_cm_id *cm_id;
	struct ib_cq *cq;
};

static int demo_setup_qp(struct demo_conn *c, struct ib_pd *pd)
{
	struct ib_qp_init_attr attr = {};

	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.cap.max_send_wr = 8192 + 1;
	attr.cap.max_rdma_ctxs = 8192;
	attr.cap.max_recv_wr = DEMO_RECV_DTOS + 1;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: max_recv_wr = 4097 is requested without comparing it with the device's max_qp_wr; QP creation fails on devices with smaller limits (1024 is the most every RDMA device supports); clamp it to ib_device.attrs [rdma-queue-cap-unchecked]
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	return rdma_create_qp(c->cm_id, pd, &attr);
}
