// RUN: %check_ulplint --kernel --check-suffixes=FULL %s rdma-send-queue-undersized %t.full -- -- -DOS_EXTRA=0
// RUN: %check_ulplint --kernel %s rdma-send-queue-undersized %t.ok -- -- -DOS_EXTRA=1

// An object-store target keeps one receive posted per command slot: the
// setup loop and the completion handler both repost through one helper,
// os_post_recv(). ib_drain_qp() at teardown posts a receive too; with
// max_recv_wr exactly conn->depth (FULL) it finds no entry. The loop over
// the connection's response buffers (not receives) is a near miss: its
// bound is not what stays posted on the receive queue.

#include <rdma/rdma_cm.h>
#include <linux/slab.h>

struct os_recv {
	struct os_conn *conn;
	struct ib_cqe cqe;
	struct ib_sge sge;
	struct ib_recv_wr wr;
	u64 dma;
};

struct os_conn {
	struct rdma_cm_id *cm_id;
	struct ib_pd *pd;
	struct ib_cq *cq;
	u32 depth;
	u32 nr_rsps;
	struct os_recv *recvs;
	u64 *rsp_dma;
};

int os_create_qp(struct os_conn *conn)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_ALL_WR;
	attr.cap.max_send_wr = conn->nr_rsps + 1;
	attr.cap.max_recv_wr = conn->depth + OS_EXTRA;
	// CHECK-MESSAGES-FULL: :[[@LINE-1]]:2: warning: max_recv_wr is {{.*}}, exactly the receives kept posted, and leaves no entry for ib_drain_qp(): on a full receive queue it cannot post its drain work request, warns and returns without draining [rdma-send-queue-undersized]
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	return rdma_create_qp(conn->cm_id, conn->pd, &attr);
}

static void os_recv_done(struct ib_cq *cq, struct ib_wc *wc);

static int os_post_recv(struct os_conn *conn, struct os_recv *r)
{
	r->sge.addr = r->dma;
	r->sge.length = 512;
	r->sge.lkey = conn->pd->local_dma_lkey;
	r->cqe.done = os_recv_done;
	r->wr.next = NULL;
	r->wr.wr_cqe = &r->cqe;
	r->wr.sg_list = &r->sge;
	r->wr.num_sge = 1;
	return ib_post_recv(conn->cm_id->qp, &r->wr, NULL);
}

static void os_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct os_recv *r = container_of(wc->wr_cqe, struct os_recv, cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	os_post_recv(r->conn, r);
}

int os_conn_start(struct os_conn *conn)
{
	u32 i;
	int ret;

	for (i = 0; i < conn->nr_rsps; i++)
		conn->rsp_dma[i] = 0;
	for (i = 0; i < conn->depth; i++) {
		conn->recvs[i].conn = conn;
		ret = os_post_recv(conn, &conn->recvs[i]);
		if (ret)
			return ret;
	}
	return 0;
}

void os_conn_close(struct os_conn *conn)
{
	rdma_disconnect(conn->cm_id);
	ib_drain_qp(conn->cm_id->qp);
	rdma_destroy_qp(conn->cm_id);
	kfree(conn->recvs);
}
