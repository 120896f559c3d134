// RUN: %check_ulplint %s rdma-invalidation-leak %t

// A server exports a statistics page to each connection through a type-1
// window bound in st_expose(). Setting the page up, a failed registration
// frees the page it has just allocated: no window can cover memory that did
// not exist when the windows were bound. Freeing a freshly allocated page
// that this function itself bound a window over and sent, or replacing the
// page while the connections' windows still cover the old one, leaves keys
// on freed memory. (The free of the page is also a release of the MR over
// it, which only the whole program can judge: that conditional finding
// must not take the window's with it.)

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct st_srv {
	struct ibv_pd *pd;
	char *stats;
	struct ibv_mr *stats_mr;
};

struct st_conn {
	struct ibv_qp *qp;
	struct ibv_mw *stats_mw;
	struct st_srv *srv;
	uint32_t key_msg;
};

static int st_send_key(struct st_conn *c, uint32_t key)
{
	struct ibv_sge sge = { .addr = (uintptr_t)&c->key_msg, .length = 4 };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	c->key_msg = key;
	return ibv_post_send(c->qp, &wr, &bad);
}

int st_expose(struct st_conn *c)
{
	struct ibv_mw_bind mwb = {
		.wr_id = 1,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = {
			.mr = c->srv->stats_mr,
			.addr = (uintptr_t)c->srv->stats,
			.length = 4096,
			.mw_access_flags = IBV_ACCESS_REMOTE_READ,
		},
	};

	if (ibv_bind_mw(c->qp, c->stats_mw, &mwb))
		return -1;
	return st_send_key(c, c->stats_mw->rkey);
}

int st_srv_init(struct st_srv *s)
{
	s->stats = aligned_alloc(4096, 4096);
	if (!s->stats)
		return -1;
	s->stats_mr = ibv_reg_mr(s->pd, s->stats, 4096, IBV_ACCESS_MW_BIND);
	if (!s->stats_mr) {
		free(s->stats);
		return -1;
	}
	return 0;
}

/* Exports a scratch copy of the page at once; gives up if the copy fails. */
int st_export_snapshot(struct st_conn *c)
{
	struct st_srv *s = c->srv;
	struct ibv_mw_bind mwb = { .wr_id = 2, .send_flags = IBV_SEND_SIGNALED };

	s->stats = aligned_alloc(4096, 4096);
	if (!s->stats)
		return -1;
	mwb.bind_info.mr = s->stats_mr;
	mwb.bind_info.addr = (uintptr_t)s->stats;
	mwb.bind_info.length = 4096;
	mwb.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_bind_mw(c->qp, c->stats_mw, &mwb))
		return -1;
	if (st_send_key(c, c->stats_mw->rkey) == 0)
		return 0;
	free(s->stats);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'free' releases the memory behind a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	return -1;
}

/* Replaces the page while the connections' windows still cover the old one. */
int st_srv_reset(struct st_srv *s)
{
	free(s->stats);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'free' releases the memory behind a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	s->stats = aligned_alloc(4096, 4096);
	return s->stats ? 0 : -1;
}
