// RUN: %check_ulplint --kernel --check-suffixes=UNGATED %s rdma-send-queue-undersized %t.ungated -- -- -DFR_GATED=0
// RUN: %check_ulplint --kernel %s rdma-send-queue-undersized %t.ok -- -- -DFR_GATED=1
// RUN: %check_ulplint --kernel --mode=plugin --check-suffixes=UNGATED %s rdma-send-queue-undersized %t.plugin -- -- -DFR_GATED=0

// An RDS-like connection: the send ring takes one entry per message, and
// fast registrations (REG_MR, then LOCAL_INV when the MR is freed) take
// credits from i_fastreg_wrs, a pool of entries the queue reserves on top
// of the ring (`while (atomic_dec_return(&ic->i_fastreg_wrs) <= 0)`).
// Gated (the default run), the registrations never exceed the reserve.
// UNGATED takes no credit: one message plus its REG_MR and LOCAL_INV
// against one entry per message. In both runs the teardown sweep that
// invalidates every MR of the connection's table is once per connection,
// not 64 invalidations per message, and the broadcast to every connection
// posts once on each connection's own queue.

#include <rdma/ib_verbs.h>
#include <linux/atomic.h>
#include <linux/slab.h>

#define FR_WRS 64
#define FR_MRS 64
#define FR_CONNS 16

struct fr_mr {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr;
	struct ib_cqe cqe;
};

struct fr_conn {
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	int send_ring_nr;
	atomic_t fastreg_wrs;
	struct fr_mr mrs[FR_MRS];
	struct ib_send_wr msg_wr;
};

static struct fr_conn *fr_conns[FR_CONNS];

int fr_create_qp(struct fr_conn *ic)
{
	struct ib_qp_init_attr attr = {};

	attr.send_cq = ic->cq;
	attr.recv_cq = ic->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.cap.max_send_wr = ic->send_ring_nr + FR_WRS + 1;
	// CHECK-MESSAGES-UNGATED: :[[@LINE-1]]:2: warning: each request posts up to 3 WRs {{.*}}[rdma-send-queue-undersized]
	attr.cap.max_recv_wr = ic->send_ring_nr;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	ic->qp = ib_create_qp(ic->pd, &attr);
	if (IS_ERR(ic->qp))
		return PTR_ERR(ic->qp);
	atomic_set(&ic->fastreg_wrs, FR_WRS);
	return 0;
}

int fr_post_reg(struct fr_conn *ic, struct fr_mr *m, int access)
{
	int ret;

#if FR_GATED
	while (atomic_dec_return(&ic->fastreg_wrs) <= 0)
		atomic_inc(&ic->fastreg_wrs);
#endif
	m->reg_wr.wr.opcode = IB_WR_REG_MR;
	m->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	m->reg_wr.wr.wr_cqe = &m->cqe;
	m->reg_wr.wr.next = NULL;
	m->reg_wr.mr = m->mr;
	m->reg_wr.key = m->mr->rkey;
	m->reg_wr.access = access;
	ret = ib_post_send(ic->qp, &m->reg_wr.wr, NULL);
	if (ret)
		atomic_inc(&ic->fastreg_wrs);
	return ret;
}

static int fr_post_inv(struct fr_conn *ic, struct fr_mr *m)
{
	int ret;

#if FR_GATED
	if (atomic_sub_return(1, &ic->fastreg_wrs) < 0) {
		atomic_inc(&ic->fastreg_wrs);
		return -EAGAIN;
	}
#endif
	m->inv_wr.opcode = IB_WR_LOCAL_INV;
	m->inv_wr.send_flags = IB_SEND_SIGNALED;
	m->inv_wr.wr_cqe = &m->cqe;
	m->inv_wr.next = NULL;
	m->inv_wr.ex.invalidate_rkey = m->mr->rkey;
	ret = ib_post_send(ic->qp, &m->inv_wr, NULL);
	if (ret)
		atomic_inc(&ic->fastreg_wrs);
	return ret;
}

int fr_send_msg(struct fr_conn *ic, struct ib_sge *sge)
{
	ic->msg_wr.opcode = IB_WR_SEND;
	ic->msg_wr.send_flags = IB_SEND_SIGNALED;
	ic->msg_wr.sg_list = sge;
	ic->msg_wr.num_sge = 1;
	ic->msg_wr.next = NULL;
	return ib_post_send(ic->qp, &ic->msg_wr, NULL);
}

int fr_free_mr(struct fr_conn *ic, struct fr_mr *m)
{
	return fr_post_inv(ic, m);
}

/* Connection teardown: every MR of the table, once per connection. */
void fr_conn_shutdown(struct fr_conn *ic)
{
	int i;

	for (i = 0; i < FR_MRS; i++)
		fr_post_inv(ic, &ic->mrs[i]);
}

/* Tell every connection: one message on each connection's own queue. */
void fr_broadcast(struct ib_sge *sge)
{
	int i;

	for (i = 0; i < FR_CONNS; i++)
		if (fr_conns[i])
			fr_send_msg(fr_conns[i], sge);
}
