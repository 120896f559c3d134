/*
 * rcache-srv: a remote object cache that hands out read leases on cached
 * objects through type-2 windows.  Under memory pressure, the evictor
 * revokes the window of a victim object and frees it.
 *
 * Not correct: the evictor posts a *signaled* LOCAL_INV but does not wait
 * for its completion before freeing the object -- the completion is reaped
 * later by the main loop, long after the memory went back to malloc.
 * Also, the index region is registered with REMOTE_READ "for a future
 * client-side lookup mode" while its key never leaves this file.
 * Correct: the normal lease return path (cache_return) waits for the
 * invalidation's completion before releasing.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct cobj {
	struct cobj   *lru_prev;
	void          *data;
	size_t         len;
	struct ibv_mw *mw;
	uint32_t       key;
	int            leased;
};

struct csrv {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	void          *index;
	size_t         index_len;
	struct ibv_mr *index_mr;
	struct cobj   *lru_tail;
};

int csrv_index_init(struct csrv *c)
{
	c->index = calloc(1, c->index_len);
	if (!c->index)
		return -ENOMEM;
	// BUG: rdma-remote-access-overbroad -- REMOTE_READ on the index, whose key is never handed out
	c->index_mr = ibv_reg_mr(c->pd, c->index, c->index_len,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!c->index_mr) {
		free(c->index);
		return -errno;
	}
	return 0;
}

static int csrv_post_inv(struct csrv *c, struct cobj *o)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)o;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = o->key;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &wr, &bad);
}

static int csrv_wait_for(struct csrv *c, struct cobj *o)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n && wc.wr_id == (uintptr_t)o)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

int cache_return(struct csrv *c, struct cobj *o)
{
	if (csrv_post_inv(c, o) || csrv_wait_for(c, o))
		return -EIO;
	o->leased = 0;
	return 0;
}

void cache_evict_one(struct csrv *c)
{
	struct cobj *o = c->lru_tail;

	if (!o)
		return;
	c->lru_tail = o->lru_prev;
	if (o->leased) {
		if (csrv_post_inv(c, o))
			return;
		o->leased = 0;
	}
	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is signaled but its completion is not waited for before the object is freed
	free(o->data);
	o->data = NULL;
}

void cache_drop(struct csrv *c, struct cobj *o)
{
	if (o->leased && cache_return(c, o))
		return;
	/* OK: rdma-unmap-before-invalidate -- cache_return() waited for the LOCAL_INV completion */
	free(o->data);
	o->data = NULL;
}
