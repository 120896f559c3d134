// RUN: %check_ulplint %s rdma-mr-leak,rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak,rdma-invalidation-leak %t.plugin

// A lock server whose spaces clients read with one-sided READs. A space
// grows by copying into a larger array that is registered anew; the grow
// helper frees the old array while its MR is registered (the clients'
// key still reaches it) and overwrites the old MR. Both mistakes are the
// helper's statements, whichever admin message led there: the dispatch
// loop that calls it is not where they are made.

#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define LS_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)

struct ls_space {
	unsigned long *locks;
	size_t nlocks;
	struct ibv_mr *mr;
	int used;
};

struct ls_msg {
	uint32_t type, space, rkey;
	uint64_t addr, nlocks;
};

struct ls_srv {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ls_space spaces[8];
	struct ls_msg in[16], out;
};

static int ls_announce(struct ls_srv *srv, struct ls_space *s)
{
	struct ibv_sge sge = { .addr = (uintptr_t)&srv->out, .length = sizeof(srv->out) };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	srv->out.addr = htobe64((uintptr_t)s->locks);
	srv->out.rkey = htobe32(s->mr->rkey);
	return ibv_post_send(srv->qp, &wr, &bad);
}

static int ls_space_add(struct ls_srv *srv, unsigned id, size_t nlocks)
{
	struct ls_space *s = &srv->spaces[id];
	struct ibv_mr *mr;

	s->locks = calloc(nlocks, sizeof(*s->locks));
	if (!s->locks)
		return -ENOMEM;
	mr = ibv_reg_mr(srv->pd, s->locks, nlocks * sizeof(*s->locks), LS_ACCESS);
	if (!mr) {
		free(s->locks);
		return -errno;
	}
	s->mr = mr;
	s->nlocks = nlocks;
	s->used = 1;
	return ls_announce(srv, s);
}

static int ls_space_grow(struct ls_srv *srv, struct ls_space *s, size_t nlocks)
{
	unsigned long *nlk;
	struct ibv_mr *nmr;

	if (nlocks <= s->nlocks)
		return 0;
	nlk = calloc(nlocks, sizeof(*nlk));
	if (!nlk)
		return -ENOMEM;
	nmr = ibv_reg_mr(srv->pd, nlk, nlocks * sizeof(*nlk), LS_ACCESS);
	if (!nmr) {
		free(nlk);
		return -errno;
	}
	memcpy(nlk, s->locks, s->nlocks * sizeof(*nlk));
	free(s->locks);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer
	// CHECK-MESSAGES: :47:26: note: rkey handed to the peer here (rkey)
	s->locks = nlk;
	s->nlocks = nlocks;
	s->mr = nmr;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: the memory region from 'ibv_reg_mr' is overwritten while still held; it leaks [rdma-mr-leak]
	// CHECK-MESSAGES: :59:7: note: memory region obtained here
	return ls_announce(srv, s);
}

/* Near miss: the same grow done right. The old MR is deregistered (its
 * key dies) before its array is freed; the new MR replaces it in the
 * space, which teardown releases, also when the announcement fails. */
static int ls_space_regrow(struct ls_srv *srv, struct ls_space *s, size_t nlocks)
{
	unsigned long *nlk;
	struct ibv_mr *nmr;

	nlk = calloc(nlocks, sizeof(*nlk));
	if (!nlk)
		return -ENOMEM;
	nmr = ibv_reg_mr(srv->pd, nlk, nlocks * sizeof(*nlk), LS_ACCESS);
	if (!nmr) {
		free(nlk);
		return -errno;
	}
	memcpy(nlk, s->locks, s->nlocks * sizeof(*nlk));
	ibv_dereg_mr(s->mr);
	free(s->locks);
	s->locks = nlk;
	s->nlocks = nlocks;
	s->mr = nmr;
	return ls_announce(srv, s);
}

static int ls_handle_admin(struct ls_srv *srv, const struct ls_msg *m)
{
	uint32_t id = be32toh(m->space);

	if (id >= 8)
		return -EINVAL;
	switch (be32toh(m->type)) {
	case 1:
		return ls_space_add(srv, id, be64toh(m->nlocks));
	case 2:
		if (!srv->spaces[id].used)
			return -ENOENT;
		return ls_space_grow(srv, &srv->spaces[id], be64toh(m->nlocks));
	case 3:
		if (!srv->spaces[id].used)
			return -ENOENT;
		return ls_space_regrow(srv, &srv->spaces[id], be64toh(m->nlocks));
	default:
		return -EPROTO;
	}
}

int ls_poll(struct ls_srv *srv)
{
	struct ibv_wc wc[8];
	int n, k;

	n = ibv_poll_cq(srv->cq, 8, wc);
	for (k = 0; k < n; k++) {
		if (wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_RECV)
			continue;
		if (wc[k].wr_id >= 16)
			continue;
		ls_handle_admin(srv, &srv->in[wc[k].wr_id]);
	}
	return n;
}

void ls_shutdown(struct ls_srv *srv)
{
	unsigned i;

	for (i = 0; i < 8; i++) {
		if (!srv->spaces[i].used)
			continue;
		ibv_dereg_mr(srv->spaces[i].mr);
		free(srv->spaces[i].locks);
	}
}
