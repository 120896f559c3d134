/*
 * slabx: a remote-cache server that exposes its slabs to clients through
 * type-2 windows (one window per slab, clients RDMA-READ items).  When the
 * allocator compacts memory it moves a slab: the window is invalidated,
 * the slab is copied to its new place, the old memory is released, and
 * the window is re-bound over the new location with a new key announced to
 * clients.
 *
 * Not correct:
 *  - compaction posts the LOCAL_INV without a completion request and
 *    releases the old slab memory right away, before the invalidation
 *    executed;
 *  - the re-bind reuses the window's old rkey, so clients holding the old
 *    (address, key) keep working against the moved slab.
 * Correct: the initial exposure binds a fresh window and waits for it.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLAB_SIZE	(1u << 20)

struct slab {
	char          *mem;
	struct ibv_mw *mw;
	uint32_t       key;
};

struct slabx {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *arena_mr;	/* LOCAL_WRITE | MW_BIND over the slab arena */
	void         (*arena_release)(void *mem);
};

static int slabx_wait(struct slabx *s)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(s->cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

static int slabx_bind(struct slabx *s, struct slab *sl, uint32_t key)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)sl;
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds windows over its slabs
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = sl->mw;
	wr.bind_mw.rkey = key;
	wr.bind_mw.bind_info.mr = s->arena_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)sl->mem;
	wr.bind_mw.bind_info.length = SLAB_SIZE;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_post_send(s->qp, &wr, &bad))
		return -EIO;
	return slabx_wait(s);
}

int slabx_expose(struct slabx *s, struct slab *sl)
{
	sl->mw = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
	if (!sl->mw)
		return -errno;
	sl->key = ibv_inc_rkey(sl->mw->rkey);
	/* OK: rdma-rkey-reuse -- first bind of a new window, with a rotated key */
	if (slabx_bind(s, sl, sl->key)) {
		ibv_dealloc_mw(sl->mw);
		sl->mw = NULL;
		return -EIO;
	}
	return 0;
}

int slabx_move(struct slabx *s, struct slab *sl, char *new_mem)
{
	struct ibv_send_wr wr, *bad;
	char *old = sl->mem;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = sl->key;
	if (ibv_post_send(s->qp, &wr, &bad))
		return -EIO;
	memcpy(new_mem, old, SLAB_SIZE);
	sl->mem = new_mem;
	// BUG: rdma-unmap-before-invalidate -- the old slab is released right after posting an unsignaled LOCAL_INV
	s->arena_release(old);
	// BUG(file): rdma-rkey-reuse -- the moved slab is re-bound with the old key instead of ibv_inc_rkey() (the WR is built in slabx_bind)
	return slabx_bind(s, sl, sl->key);
}
