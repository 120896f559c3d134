// RUN: %check_ulplint %s rdma-invalidation-leak %t

// Where a finding lands when a root calls a helper that releases. A timer
// tick that does nothing to a window but call the one function that
// handles its timeout (called from nowhere else): the timeout handler's
// own path is wrong, and the finding is there. A completion handler that
// calls the request's put helper (also called, correctly, after a LOCAL_INV
// elsewhere) made the mistake at its call.

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define RM_WINDOWS 32

struct rm_win {
	struct ibv_mw *mw;
	struct rm_win *next;
	uint64_t addr;
	uint32_t len;
	uint32_t rkey;
	time_t deadline;
	bool active;
};

struct rm_ep {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct rm_win pool[RM_WINDOWS];
	struct rm_win *free_list;
	uint64_t wrid;
};

int rm_ep_init(struct rm_ep *ep)
{
	int i;

	for (i = 0; i < RM_WINDOWS; i++) {
		ep->pool[i].mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2);
		if (!ep->pool[i].mw)
			goto unwind;
		ep->pool[i].rkey = ep->pool[i].mw->rkey;
		ep->pool[i].next = ep->free_list;
		ep->free_list = &ep->pool[i];
	}
	return 0;
unwind:
	while (i--)
		ibv_dealloc_mw(ep->pool[i].mw);
	return -1;
}

int rm_expose(struct rm_ep *ep, struct rm_win *w, uint64_t addr, uint32_t len)
{
	struct ibv_send_wr wr = {}, *bad;

	w->rkey = ibv_inc_rkey(w->rkey);
	wr.wr_id = ++ep->wrid;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = w->mw;
	wr.bind_mw.rkey = w->rkey;
	wr.bind_mw.bind_info.mr = ep->mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(ep->qp, &wr, &bad))
		return -1;
	w->addr = addr;
	w->len = len;
	w->active = true;
	return 0;
}

static void rm_win_put(struct rm_ep *ep, struct rm_win *w)
{
	w->active = false;
	w->next = ep->free_list;
	ep->free_list = w;
}

static int rm_local_inv(struct rm_ep *ep, struct rm_win *w)
{
	struct ibv_send_wr wr = {}, *bad;
	struct ibv_wc wc;
	int n;

	wr.wr_id = ++ep->wrid;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = w->rkey;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(ep->qp, &wr, &bad))
		return -1;
	do {
		n = ibv_poll_cq(ep->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != wr.wr_id));
	return n < 0 || wc.status != IBV_WC_SUCCESS ? -1 : 0;
}

/* The transfer is finished: revoke the key, then reuse the window. */
int rm_done(struct rm_ep *ep, struct rm_win *w)
{
	if (rm_local_inv(ep, w))
		return -1;
	rm_win_put(ep, w);
	return 0;
}

/* The peer reported an error: give the window back. */
void rm_peer_error(struct rm_ep *ep, struct rm_win *w)
{
	rm_win_put(ep, w);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'rm_win_put' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
}

static void rm_timeout(struct rm_ep *ep, struct rm_win *w)
{
	w->active = false;
	w->len = 0;
	w->next = ep->free_list;
	ep->free_list = w;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'free list' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
}

void rm_check_timeouts(struct rm_ep *ep)
{
	time_t now = time(NULL);
	int i;

	for (i = 0; i < RM_WINDOWS; i++) {
		struct rm_win *w = &ep->pool[i];

		if (w->active && now > w->deadline)
			rm_timeout(ep, w);
	}
}
