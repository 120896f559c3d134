// RUN: %check_ulplint %s rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-invalidation-leak %t.plugin

// A broker lends large-message buffers through type-2 windows. Every work
// request goes out through one helper, lb_post(), which the window bind,
// the LOCAL_INV and the control SEND each call with the WR they built: each
// call posts its own caller's WR. A buffer handed back after a waited
// LOCAL_INV is fine; one handed back after only a control SEND (which
// invalidates nothing) or after nothing at all still has its key out.

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define LB_NBUF 16
#define LB_SIZE (1 << 20)

struct lb_buf {
	struct ibv_mw *mw;
	void *mem;
	uint32_t rkey;
	bool busy;
};

struct lb_conn {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *pool_mr;
	uint64_t wrid;
	uint32_t notice;
};

static struct lb_buf lb_bufs[LB_NBUF];

static int lb_wait(struct lb_conn *c, uint64_t wrid)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != wrid));
	return n < 0 || wc.status != IBV_WC_SUCCESS ? -1 : 0;
}

static int lb_post(struct lb_conn *c, struct ibv_send_wr *wr, bool wait)
{
	struct ibv_send_wr *bad;

	wr->wr_id = ++c->wrid;
	if (wait)
		wr->send_flags |= IBV_SEND_SIGNALED;
	if (ibv_post_send(c->qp, wr, &bad))
		return -1;
	return wait ? lb_wait(c, wr->wr_id) : 0;
}

static int lb_bind(struct lb_conn *c, struct lb_buf *b, uint32_t len)
{
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_BIND_MW;
	wr.bind_mw.mw = b->mw;
	wr.bind_mw.rkey = b->rkey;
	wr.bind_mw.bind_info.mr = c->pool_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)b->mem;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	return lb_post(c, &wr, true);
}

static int lb_local_inv(struct lb_conn *c, struct lb_buf *b)
{
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = b->rkey;
	return lb_post(c, &wr, true);
}

static int lb_send_notice(struct lb_conn *c, uint32_t what)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->notice, .length = sizeof(c->notice),
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE,
	};

	c->notice = what;
	return lb_post(c, &wr, false);
}

struct lb_buf *lb_take(void)
{
	int i;

	for (i = 0; i < LB_NBUF; i++)
		if (!lb_bufs[i].busy && lb_bufs[i].mw) {
			lb_bufs[i].busy = true;
			return &lb_bufs[i];
		}
	return NULL;
}

int lb_lend(struct lb_conn *c, struct lb_buf *b, uint32_t len)
{
	b->rkey = ibv_inc_rkey(b->rkey);
	if (lb_bind(c, b, len)) {
		b->busy = false;
		return -1;
	}
	return lb_send_notice(c, b->rkey);
}

/* The borrower is done: take the key back, then recycle. */
int lb_return(struct lb_conn *c, struct lb_buf *b)
{
	if (lb_local_inv(c, b))
		return -1;
	b->busy = false;
	return 0;
}

/* The borrower went away: tell the peer, and recycle at once. */
int lb_cancel(struct lb_conn *c, struct lb_buf *b)
{
	if (lb_send_notice(c, 0))
		return -1;
	b->busy = false;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'b->busy = false' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	return 0;
}

/* A lease ran out: the buffer goes back while the key is still out. */
void lb_expire(struct lb_conn *c, struct lb_buf *b)
{
	b->busy = false;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'b->busy = false' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
}
