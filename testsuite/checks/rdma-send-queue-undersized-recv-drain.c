// RUN: %check_ulplint --kernel --check-suffixes=FULL %s rdma-send-queue-undersized %t.full -- -- -DRD_EXTRA=0
// RUN: %check_ulplint --kernel %s rdma-send-queue-undersized %t.ok -- -- -DRD_EXTRA=1

// A connection keeps RD_NR_ACKS receives posted (reposted from their
// completion) and drains the QP at teardown. ib_drain_qp() posts a receive
// too: with max_recv_wr exactly the receives kept posted (FULL) it has no
// entry and returns without draining. The send side has its drain entry.

#include <rdma/rdma_cm.h>
#include <linux/slab.h>

#define RD_NR_ACKS 8

struct rd_ack {
	struct rd_conn *conn;
	struct ib_cqe cqe;
	struct ib_sge sge;
	struct ib_recv_wr wr;
};

struct rd_conn {
	struct rdma_cm_id *cm_id;
	struct ib_pd *pd;
	struct ib_cq *cq;
	int depth;
	u64 acks_dma;
	struct rd_ack acks[RD_NR_ACKS];
};

int rd_create_qp(struct rd_conn *c)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_ALL_WR;
	attr.cap.max_send_wr = c->depth + 1;
	attr.cap.max_recv_wr = RD_NR_ACKS + RD_EXTRA;
	// CHECK-MESSAGES-FULL: :[[@LINE-1]]:2: warning: max_recv_wr is {{.*}}, exactly the receives kept posted, and leaves no entry for ib_drain_qp(): on a full receive queue it cannot post its drain work request, warns and returns without draining [rdma-send-queue-undersized]
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	return rdma_create_qp(c->cm_id, c->pd, &attr);
}

static void rd_ack_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rd_ack *ack = container_of(wc->wr_cqe, struct rd_ack, cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	ib_post_recv(ack->conn->cm_id->qp, &ack->wr, NULL);
}

int rd_post_acks(struct rd_conn *c)
{
	int i, ret;

	for (i = 0; i < RD_NR_ACKS; i++) {
		struct rd_ack *ack = &c->acks[i];

		ack->conn = c;
		ack->cqe.done = rd_ack_done;
		ack->sge.addr = c->acks_dma + i * 4;
		ack->sge.length = 4;
		ack->sge.lkey = c->pd->local_dma_lkey;
		ack->wr.next = NULL;
		ack->wr.wr_cqe = &ack->cqe;
		ack->wr.sg_list = &ack->sge;
		ack->wr.num_sge = 1;
		ret = ib_post_recv(c->cm_id->qp, &ack->wr, NULL);
		if (ret)
			return ret;
	}
	return 0;
}

void rd_destroy(struct rd_conn *c)
{
	rdma_disconnect(c->cm_id);
	ib_drain_qp(c->cm_id->qp);
	rdma_destroy_qp(c->cm_id);
}
