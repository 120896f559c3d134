// RUN: %check_ulplint %s rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-invalidation-leak %t.plugin

// A telemetry exporter publishes frames to a collector through a type-2
// window bound over the frame. Frames come from an array-stack pool and
// large ones from malloc; both go back through small wrappers that take
// the frame's memory (`frame_put(exp, f)`, `frame_free(f)`). Giving a
// frame back while the window is still bound over it hands memory the
// collector can read to the next user; invalidating and waiting first
// does not.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

#define TX_FRAMES 8
#define TX_FRAME_SIZE 4096

struct tx_exporter {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *pool_mr;
	struct ibv_mw *mw;
	void *free_frames[TX_FRAMES];
	int nfree;
	void *frame;
	int big;
};

static void frame_put(struct tx_exporter *exp, void *frame)
{
	exp->free_frames[exp->nfree++] = frame;
}

static void frame_free(void *frame)
{
	free(frame);
}

static int tx_wait(struct tx_exporter *exp)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(exp->cq, 1, &wc)) == 0)
		;
	return n < 0 || wc.status != IBV_WC_SUCCESS ? -1 : 0;
}

int tx_publish(struct tx_exporter *exp, void *frame)
{
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = exp->mw;
	wr.bind_mw.rkey = ibv_inc_rkey(exp->mw->rkey);
	wr.bind_mw.bind_info.mr = exp->pool_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)frame;
	wr.bind_mw.bind_info.length = TX_FRAME_SIZE;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_post_send(exp->qp, &wr, &bad))
		return -1;
	exp->frame = frame; /* kept here; later released under this name */
	return tx_wait(exp);
}

/* The collector went away: drop the frame at once. */
void tx_detach(struct tx_exporter *exp)
{
	if (exp->big)
		frame_free(exp->frame);
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'frame_free' releases the memory behind a memory window whose rkey is still valid for the peer
	else
		frame_put(exp, exp->frame);
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'frame_put' releases the memory behind a memory window whose rkey is still valid for the peer
	exp->frame = NULL;
}

/* Near miss: the window is invalidated, and the invalidation completed,
 * before the frame goes back. */
int tx_retire(struct tx_exporter *exp)
{
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = exp->mw->rkey;
	if (ibv_post_send(exp->qp, &wr, &bad) || tx_wait(exp))
		return -1;
	if (exp->big)
		frame_free(exp->frame);
	else
		frame_put(exp, exp->frame);
	exp->frame = NULL;
	return 0;
}
