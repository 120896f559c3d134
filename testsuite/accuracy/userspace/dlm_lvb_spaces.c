/*
 * dlmd: the lock-space table of a distributed lock manager whose clients
 * take locks with remote atomics (CAS on the lock word) and read/write the
 * lock value blocks with one-sided RDMA.  Each lock space is one array of
 * lock records, registered with remote read/write/atomic rights; its
 * (va, rkey, len) is announced to every connected client.  Spaces are
 * created at start-up from the configuration, added at run time by an
 * administrator, grown when they run out of locks, and dropped.
 *
 * Correct: start-up registers the spaces in a loop unwound with
 * while (i--) on failure; dropping a space deregisters it before its memory
 * is freed; adding and growing spaces are rare administrative events, not
 * per-lock operations.
 *
 * Not correct: adding a space returns without deregistering when the
 * owner table cannot be allocated; growing a space frees the old lock
 * array and overwrites the space's MR without deregistering it, so the old
 * key (still cached by clients until they see the announcement) keeps
 * reaching freed memory, and the old MR leaks.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DLM_MAX_SPACES	16
#define DLM_MAX_CLIENTS	64

struct dlm_lock {
	uint64_t word;		/* owner id | mode, taken with CAS */
	uint64_t seq;
	uint8_t  lvb[48];
};

enum { DLM_ADD_SPACE = 1, DLM_GROW_SPACE, DLM_DROP_SPACE, DLM_SPACE_INFO };

struct dlm_msg {
	uint32_t type;
	uint32_t space;
	uint64_t va;
	uint64_t nlocks;
	uint32_t rkey;
	uint32_t rsvd;
};

struct dlm_space {
	int               used;
	uint32_t          id;
	struct dlm_lock  *locks;
	size_t            nlocks;
	struct ibv_mr    *mr;
	uint32_t         *owner;	/* server-side bookkeeping per lock */
};

struct dlm_srv {
	struct ibv_pd   *pd;
	struct ibv_cq   *cq;
	struct ibv_qp   *client_qp[DLM_MAX_CLIENTS];
	unsigned int     nclients;
	struct ibv_mr   *msg_mr;	/* covers out[] and in[] */
	struct dlm_msg   out[DLM_MAX_CLIENTS];
	struct dlm_msg   in[DLM_MAX_CLIENTS];
	struct dlm_space spaces[DLM_MAX_SPACES];
	unsigned int     nspaces;
};

static int dlm_access(void)
{
	return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
	       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
}

static int dlm_announce(struct dlm_srv *srv, struct dlm_space *s, uint32_t type)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	unsigned int c;
	int ret = 0;

	for (c = 0; c < srv->nclients; c++) {
		struct dlm_msg *m = &srv->out[c];

		m->type = htobe32(type);
		m->space = htobe32(s->id);
		m->va = htobe64((uintptr_t)s->locks);
		m->nlocks = htobe64(s->nlocks);
		m->rkey = htobe32(s->mr ? s->mr->rkey : 0);
		sge.addr = (uintptr_t)m;
		sge.length = sizeof(*m);
		sge.lkey = srv->msg_mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = c;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		if (ibv_post_send(srv->client_qp[c], &wr, &bad))
			ret = -EIO;
	}
	return ret;
}

int dlm_spaces_init(struct dlm_srv *srv, unsigned int n, size_t nlocks)
{
	unsigned int i;

	if (n > DLM_MAX_SPACES)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		struct dlm_space *s = &srv->spaces[i];

		s->id = i;
		s->nlocks = nlocks;
		s->locks = calloc(nlocks, sizeof(*s->locks));
		s->owner = calloc(nlocks, sizeof(*s->owner));
		if (!s->locks || !s->owner)
			goto err_mem;
		/* OK: rdma-access-flags-invalid -- dlm_access() includes LOCAL_WRITE with the remote write/atomic rights */
		s->mr = ibv_reg_mr(srv->pd, s->locks, nlocks * sizeof(*s->locks), dlm_access()); // BUG: rdma-local-mr-management -- the space's rkey is announced to clients
		if (!s->mr)
			goto err_mem;
		s->used = 1;
	}
	srv->nspaces = n;
	return 0;

err_mem:
	free(srv->spaces[i].locks);
	free(srv->spaces[i].owner);
	/* OK: rdma-mr-leak -- every space registered before the failure is deregistered */
	while (i--) {
		ibv_dereg_mr(srv->spaces[i].mr);
		free(srv->spaces[i].locks);
		free(srv->spaces[i].owner);
		srv->spaces[i].used = 0;
	}
	return -ENOMEM;
}

static int dlm_space_add(struct dlm_srv *srv, size_t nlocks)
{
	struct dlm_space *s;
	struct dlm_lock *locks;
	struct ibv_mr *mr;
	uint32_t *owner;

	if (srv->nspaces == DLM_MAX_SPACES)
		return -ENOSPC;
	locks = calloc(nlocks, sizeof(*locks));
	if (!locks)
		return -ENOMEM;
	/* OK: rdma-registration-in-datapath -- an administrator adds a lock space; not a per-lock operation */
	mr = ibv_reg_mr(srv->pd, locks, nlocks * sizeof(*locks), dlm_access()); // BUG: rdma-local-mr-management -- the new space's rkey is announced to clients
	if (!mr) {
		free(locks);
		return -errno;
	}
	owner = calloc(nlocks, sizeof(*owner));
	if (!owner)
		return -ENOMEM; // BUG: rdma-mr-leak -- the space's MR (and its lock array) is dropped on this error return

	s = &srv->spaces[srv->nspaces];
	s->id = srv->nspaces++;
	s->locks = locks;
	s->nlocks = nlocks;
	s->mr = mr;
	s->owner = owner;
	s->used = 1;
	return dlm_announce(srv, s, DLM_SPACE_INFO);
}

/* clients were told to quiesce the space before the GROW request */
static int dlm_space_grow(struct dlm_srv *srv, struct dlm_space *s, size_t nlocks)
{
	struct dlm_lock *nlk;
	struct ibv_mr *nmr;
	uint32_t *nown;

	if (nlocks <= s->nlocks)
		return 0;
	nlk = calloc(nlocks, sizeof(*nlk));
	nown = calloc(nlocks, sizeof(*nown));
	if (!nlk || !nown) {
		free(nlk);
		free(nown);
		return -ENOMEM;
	}
	/* OK: rdma-registration-in-datapath -- growing a lock space is a rare administrative event */
	nmr = ibv_reg_mr(srv->pd, nlk, nlocks * sizeof(*nlk), dlm_access()); // BUG: rdma-local-mr-management -- the grown space's rkey is announced to clients
	if (!nmr) {
		free(nlk);
		free(nown);
		return -errno;
	}
	memcpy(nlk, s->locks, s->nlocks * sizeof(*nlk));
	memcpy(nown, s->owner, s->nlocks * sizeof(*nown));
	free(s->locks); // BUG: rdma-invalidation-leak -- the old lock array is freed while its MR (key held by every client) is still registered
	free(s->owner);
	s->locks = nlk;
	s->owner = nown;
	s->nlocks = nlocks;
	s->mr = nmr; // BUG: rdma-mr-leak -- the old space MR is overwritten without ibv_dereg_mr()
	return dlm_announce(srv, s, DLM_SPACE_INFO);
}

static int dlm_space_drop(struct dlm_srv *srv, struct dlm_space *s)
{
	int ret;

	ibv_dereg_mr(s->mr);
	s->mr = NULL;
	ret = dlm_announce(srv, s, DLM_DROP_SPACE);
	free(s->locks); // OK: rdma-invalidation-leak -- the MR was deregistered (key dead) before the lock array is freed
	free(s->owner);
	s->locks = NULL;
	s->owner = NULL;
	s->used = 0;
	return ret;
}

static int dlm_handle_admin(struct dlm_srv *srv, const struct dlm_msg *m)
{
	uint32_t id = be32toh(m->space);

	switch (be32toh(m->type)) {
	case DLM_ADD_SPACE:
		return dlm_space_add(srv, be64toh(m->nlocks));
	case DLM_GROW_SPACE:
		if (id >= srv->nspaces || !srv->spaces[id].used)
			return -ENOENT;
		return dlm_space_grow(srv, &srv->spaces[id], be64toh(m->nlocks));
	case DLM_DROP_SPACE:
		if (id >= srv->nspaces || !srv->spaces[id].used)
			return -ENOENT;
		return dlm_space_drop(srv, &srv->spaces[id]);
	default:
		return -EPROTO;
	}
}

int dlm_poll(struct dlm_srv *srv)
{
	struct ibv_wc wc[8];
	int n, k;

	n = ibv_poll_cq(srv->cq, 8, wc);
	for (k = 0; k < n; k++) {
		if (wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_RECV)
			continue;
		if (wc[k].wr_id >= DLM_MAX_CLIENTS)
			continue;
		dlm_handle_admin(srv, &srv->in[wc[k].wr_id]);
	}
	return n;
}
