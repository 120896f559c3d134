/*
 * rpool: a pool of receive-side landing buffers that peers RDMA-WRITE into
 * (the pool's rkey is handed out in the connection handshake).  The pool
 * can be rebuilt with a different buffer count while the service runs
 * (rpool_resize) and is torn down at shutdown (rpool_destroy).
 *
 * rpool_destroy() does it in the right order: deregister (which kills the
 * rkey), then free the memory.  rpool_resize() was written later and frees
 * the old buffers first, "the MR goes away two lines later anyway" -- in
 * between, and for as long as the deregistration fails, peers holding the
 * handshake key write into memory malloc may already have reused.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RPOOL_BUF	8192

struct rpool {
	struct ibv_pd *pd;
	char          *mem;
	unsigned int   nbufs;
	struct ibv_mr *mr;
};

struct rpool_handshake {
	uint64_t base;
	uint32_t rkey;
	uint32_t nbufs;
};

int rpool_create(struct rpool *p, unsigned int nbufs, struct rpool_handshake *hs)
{
	p->mem = aligned_alloc(4096, (size_t)nbufs * RPOOL_BUF);
	if (!p->mem)
		return -ENOMEM;
	p->nbufs = nbufs;
	p->mr = ibv_reg_mr(p->pd, p->mem, (size_t)nbufs * RPOOL_BUF, // BUG: rdma-local-mr-management -- rkey handed to peers
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!p->mr) {
		free(p->mem);
		p->mem = NULL;
		return -errno;
	}
	/* OK: rdma-remote-access-overbroad -- the key goes into the handshake */
	hs->base = (uintptr_t)p->mem;
	hs->rkey = p->mr->rkey;
	hs->nbufs = nbufs;
	return 0;
}

int rpool_resize(struct rpool *p, unsigned int nbufs, struct rpool_handshake *hs)
{
	struct rpool old = *p;
	int ret;

	ret = rpool_create(p, nbufs, hs);
	if (ret) {
		*p = old;
		return ret;
	}
	// BUG: rdma-invalidation-leak -- the old buffers go back to malloc while old.mr (REMOTE_WRITE) is still registered
	free(old.mem);
	ibv_dereg_mr(old.mr);
	return 0;
}

void rpool_destroy(struct rpool *p)
{
	ibv_dereg_mr(p->mr);
	/* OK: rdma-invalidation-leak -- the MR (and its key) is gone before the memory is freed */
	free(p->mem);
	p->mem = NULL;
	p->mr = NULL;
}
