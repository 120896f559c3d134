// RUN: %check_ulplint --kernel %s rdma-unsignaled-send-starvation %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-unsignaled-send-starvation %t.plugin

// Signal intervals and send-queue counters in kernel style: a counter that
// only goes the wrong way, one that is only ever reset, a local that starts
// again on every call, a decision made in a helper that returns the flags,
// and a control QP next to a data QP that signals. Near misses: loop
// indices, counters moved by atomic helpers, a free-entry count that goes
// down on every post, registrations posted on a QP whose sends are
// elsewhere.

#include <linux/atomic.h>
#include <linux/string.h>
#include <rdma/ib_verbs.h>

#define TLM_LOW_WATER 4
#define TLM_BATCH 16
#define EVS_SIGNAL_EVERY 32

struct tlm_chan {
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct ib_cqe cqe;
	u32 depth;
	u32 sq_free;     /* set to the depth, never decremented */
	u32 sq_avail;    /* decremented per post, given back on completion */
	atomic_t unsignaled;
	atomic_t pending;
};

static void tlm_build(struct tlm_chan *tc, struct ib_send_wr *wr,
		      struct ib_sge *sge, u64 dma, u32 len)
{
	memset(wr, 0, sizeof(*wr));
	sge->addr = dma;
	sge->length = len;
	sge->lkey = tc->pd->local_dma_lkey;
	wr->wr_cqe = &tc->cqe;
	wr->opcode = IB_WR_SEND;
	wr->sg_list = sge;
	wr->num_sge = 1;
}

static void tlm_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct tlm_chan *tc = container_of(wc->wr_cqe, struct tlm_chan, cqe);

	tc->sq_free++; /* only ever grows: the low-water test needs it to drop */
	tc->sq_avail += TLM_LOW_WATER;
}

int tlm_trace_send(struct tlm_chan *tc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(tc, &wr, &sge, dma, len);
	if (tc->sq_free < TLM_LOW_WATER)
		// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: signaling depends on 'tc->sq_free', which nothing in the program goes down; the signaled branch never runs and the send queue is never reclaimed [rdma-unsignaled-send-starvation]
		wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(tc->qp, &wr, NULL);
}

int tlm_metric_send(struct tlm_chan *tc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(tc, &wr, &sge, dma, len);
	if (atomic_read(&tc->unsignaled) >= TLM_BATCH) {
		// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: signaling depends on 'atomic_read(&tc->unsignaled)', which nothing in the program goes up; the signaled branch never runs and the send queue is never reclaimed [rdma-unsignaled-send-starvation]
		wr.send_flags = IB_SEND_SIGNALED;
		atomic_set(&tc->unsignaled, 0);
	}
	return ib_post_send(tc->qp, &wr, NULL);
}

int tlm_event_send(struct tlm_chan *tc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;
	u32 since_signal = 0;

	tlm_build(tc, &wr, &sge, dma, len);
	if (++since_signal == EVS_SIGNAL_EVERY) {
		// CHECK-MESSAGES: :[[@LINE-1]]:8: warning: signaling depends on 'since_signal', a local that starts again from the same value on every call; the signaled branch never runs and the send queue is never reclaimed [rdma-unsignaled-send-starvation]
		wr.send_flags = IB_SEND_SIGNALED;
		since_signal = 0;
	}
	return ib_post_send(tc->qp, &wr, NULL);
}

/* Near miss: the free-entry count goes down on every post. */
int tlm_alert_send(struct tlm_chan *tc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(tc, &wr, &sge, dma, len);
	tc->sq_avail--;
	if (tc->sq_avail < TLM_LOW_WATER)
		wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(tc->qp, &wr, NULL);
}

/* Near miss: the atomic counter is advanced by the read itself. */
int tlm_bulk_send(struct tlm_chan *tc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(tc, &wr, &sge, dma, len);
	if (atomic_inc_return(&tc->pending) % TLM_BATCH == 0)
		wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(tc->qp, &wr, NULL);
}

/* Near miss: the last of a batch posted in a loop is signaled. */
int tlm_burst_send(struct tlm_chan *tc, u64 dma, u32 len, int n)
{
	struct ib_send_wr wr;
	struct ib_sge sge;
	int i, ret;

	for (i = 0; i < n; i++) {
		tlm_build(tc, &wr, &sge, dma + i * len, len);
		if (i == n - 1)
			wr.send_flags = IB_SEND_SIGNALED;
		ret = ib_post_send(tc->qp, &wr, NULL);
		if (ret)
			return ret;
	}
	return 0;
}

/* The decision lives in a helper that returns the flags. */
struct logfwd {
	struct ib_qp *qp;
	struct ib_cqe cqe;
	unsigned int unsignaled; /* only reset */
	unsigned int posted;     /* advanced per post */
};

static unsigned int logfwd_send_flags(struct logfwd *f)
{
	if (f->unsignaled >= TLM_BATCH) {
		// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: signaling depends on 'f->unsignaled', which nothing in the program goes up; the signaled branch never runs and the send queue is never reclaimed [rdma-unsignaled-send-starvation]
		f->unsignaled = 0;
		return IB_SEND_SIGNALED;
	}
	return 0;
}

/* Near miss: the same shape with a counter that is advanced. */
static unsigned int logfwd_batch_flags(struct logfwd *f)
{
	if (f->posted++ % TLM_BATCH == 0)
		return IB_SEND_SIGNALED;
	return 0;
}

int logfwd_send(struct logfwd *f, struct ib_sge *sge, bool batch)
{
	struct ib_send_wr wr = {};

	wr.wr_cqe = &f->cqe;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = sge;
	wr.num_sge = 1;
	wr.send_flags = batch ? logfwd_batch_flags(f) : logfwd_send_flags(f);
	return ib_post_send(f->qp, &wr, NULL);
}

/* Near miss: a dispatch on a received command, not a counter. */
struct evs_cmd {
	u8 opcode;
	u32 len;
};

struct evs_io {
	struct ib_qp *qp;
	struct ib_cqe cqe;
	struct evs_cmd cmd;
	struct ib_send_wr wr;
};

void evs_take_cmd(struct evs_io *io, const struct evs_cmd *wire)
{
	io->cmd.opcode = wire->opcode;
	io->cmd.len = wire->len;
}

int evs_execute(struct evs_io *io)
{
	io->wr.wr_cqe = &io->cqe;
	io->wr.opcode = IB_WR_SEND;
	io->wr.send_flags = 0;
	if (io->cmd.opcode == 1)
		io->wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(io->qp, &io->wr, NULL);
}

/* Two QPs in one file: the data QP signals, the control QP never does. */
struct dfs_conn {
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *ctrl_qp;
	struct ib_qp *data_qp;
	struct ib_cqe cqe;
};

int dfs_create_qps(struct dfs_conn *c)
{
	struct ib_qp_init_attr attr = {};

	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.cap.max_send_wr = 16;
	attr.cap.max_recv_wr = 16;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: only work requests that ask for it are signaled on this QP, but no post on it sets IB_SEND_SIGNALED; completed send-queue entries are never reclaimed and posts fail once the queue fills [rdma-unsignaled-send-starvation]
	// CHECK-MESSAGES: :[[@LINE+26]]:9: note: posted unsignaled here
	c->ctrl_qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->ctrl_qp))
		return PTR_ERR(c->ctrl_qp);

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.cap.max_send_wr = 64;
	attr.cap.max_recv_wr = 16;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	c->data_qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->data_qp))
		return PTR_ERR(c->data_qp);
	return 0;
}

int dfs_send_ctrl(struct dfs_conn *c, struct ib_sge *sge)
{
	struct ib_send_wr wr = {};

	wr.wr_cqe = &c->cqe;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = sge;
	wr.num_sge = 1;
	return ib_post_send(c->ctrl_qp, &wr, NULL);
}

int dfs_write_data(struct dfs_conn *c, struct ib_sge *sge, u64 raddr, u32 rkey)
{
	struct ib_rdma_wr wr = {};

	wr.wr.wr_cqe = &c->cqe;
	wr.wr.opcode = IB_WR_RDMA_WRITE;
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.wr.sg_list = sge;
	wr.wr.num_sge = 1;
	wr.remote_addr = raddr;
	wr.rkey = rkey;
	return ib_post_send(c->data_qp, &wr.wr, NULL);
}

// An RPC transport's Sends, signaled every send_batch posts by a countdown
// reloaded in the signaled branch; the flags of the request's Send are
// only ever or-ed and masked. The countdown is never counted down.
struct rpx_ep {
	struct ib_qp *qp;
	unsigned int send_count;
	unsigned int send_batch;
};

struct rpx_req {
	struct ib_send_wr send_wr;
	struct ib_sge sge;
};

void rpx_ep_connect(struct rpx_ep *ep)
{
	ep->send_count = ep->send_batch;
}

int rpx_post_send(struct rpx_ep *ep, struct rpx_req *req)
{
	struct ib_send_wr *send_wr = &req->send_wr;

	send_wr->opcode = IB_WR_SEND;
	send_wr->sg_list = &req->sge;
	send_wr->num_sge = 1;
	if (!ep->send_count) {
		// CHECK-MESSAGES: :[[@LINE-1]]:7: warning: signaling depends on 'ep->send_count', which nothing in the program {{.*}}[rdma-unsignaled-send-starvation]
		send_wr->send_flags |= IB_SEND_SIGNALED;
		ep->send_count = ep->send_batch;
	} else {
		send_wr->send_flags &= ~IB_SEND_SIGNALED;
	}
	return ib_post_send(ep->qp, send_wr, NULL);
}

// The same countdown in another transport, counted down: a near miss.
struct rpy_ep {
	struct ib_qp *qp;
	unsigned int send_count;
	unsigned int send_batch;
};

int rpy_post_send(struct rpy_ep *ep, struct rpx_req *req)
{
	req->send_wr.opcode = IB_WR_SEND;
	if (!--ep->send_count) {
		req->send_wr.send_flags |= IB_SEND_SIGNALED;
		ep->send_count = ep->send_batch;
	}
	return ib_post_send(ep->qp, &req->send_wr, NULL);
}

// One connection WR posted by two paths, each deciding its signaling: the
// notifications advance their counter, the keepalives never do.
struct ntf_conn {
	struct ib_qp *qp;
	struct ib_send_wr ctrl_wr;
	struct ib_sge ctrl_sge;
	atomic_t notify_cnt;
	unsigned int ka_unsignaled;
};

int ntf_notify(struct ntf_conn *conn)
{
	memset(&conn->ctrl_wr, 0, sizeof(conn->ctrl_wr));
	conn->ctrl_wr.opcode = IB_WR_SEND;
	conn->ctrl_wr.sg_list = &conn->ctrl_sge;
	conn->ctrl_wr.num_sge = 1;
	conn->ctrl_wr.send_flags = IB_SEND_INLINE;
	if (atomic_inc_return(&conn->notify_cnt) % EVS_SIGNAL_EVERY == 0)
		conn->ctrl_wr.send_flags |= IB_SEND_SIGNALED;
	return ib_post_send(conn->qp, &conn->ctrl_wr, NULL);
}

int ntf_keepalive(struct ntf_conn *conn)
{
	memset(&conn->ctrl_wr, 0, sizeof(conn->ctrl_wr));
	conn->ctrl_wr.opcode = IB_WR_SEND;
	conn->ctrl_wr.sg_list = &conn->ctrl_sge;
	conn->ctrl_wr.num_sge = 1;
	conn->ctrl_wr.send_flags = IB_SEND_INLINE;
	if (conn->ka_unsignaled >= TLM_BATCH) {
		// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: signaling depends on 'conn->ka_unsignaled', which nothing in the program goes up{{.*}}[rdma-unsignaled-send-starvation]
		conn->ctrl_wr.send_flags |= IB_SEND_SIGNALED;
		conn->ka_unsignaled = 0;
	}
	return ib_post_send(conn->qp, &conn->ctrl_wr, NULL);
}

// Congestion updates on an RDS-style connection: a countdown loaded at
// setup and reloaded where it signals. The update path never counts it
// down, so only the first update is signaled; the data path counts its own
// countdown down before testing it.
#define CGU_SIGNAL_EVERY 16

struct cgu_conn {
	struct ib_qp *qp;
	struct ib_send_wr cong_wr;
	struct ib_send_wr data_wr;
	unsigned int cong_unsig;
	unsigned int data_unsig;
};

void cgu_setup(struct cgu_conn *ic)
{
	ic->cong_unsig = CGU_SIGNAL_EVERY;
	ic->data_unsig = CGU_SIGNAL_EVERY;
}

int cgu_send_cong_update(struct cgu_conn *ic)
{
	ic->cong_wr.opcode = IB_WR_SEND;
	ic->cong_wr.send_flags = 0;
	if (!ic->cong_unsig) {
		// CHECK-MESSAGES: :[[@LINE-1]]:7: warning: signaling depends on 'ic->cong_unsig', which nothing in the program changes{{.*}}[rdma-unsignaled-send-starvation]
		ic->cong_wr.send_flags |= IB_SEND_SIGNALED;
		ic->cong_unsig = CGU_SIGNAL_EVERY;
	}
	return ib_post_send(ic->qp, &ic->cong_wr, NULL);
}

int cgu_send_data(struct cgu_conn *ic)
{
	ic->data_wr.opcode = IB_WR_SEND;
	ic->data_wr.send_flags = 0;
	if (--ic->data_unsig == 0) {
		ic->data_wr.send_flags |= IB_SEND_SIGNALED;
		ic->data_unsig = CGU_SIGNAL_EVERY;
	}
	return ib_post_send(ic->qp, &ic->data_wr, NULL);
}
