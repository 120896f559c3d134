/*
 * tgt_mem.c: the target's data-buffer pool.  One area, registered once at
 * start-up, carved into TGT_DEPTH buffers; buffers go back on the free
 * list when their command completed.  No key of this pool is ever sent to
 * a host: hosts never access target memory.
 *
 * The pool is registered LOCAL_WRITE only.  That is enough as the source
 * of RDMA WRITEs and as the sink of RDMA READs on InfiniBand and RoCE,
 * but not as the sink of RDMA READs on iWARP (see tgt_io.c, where the
 * READ is posted).
 */
#include "tgt.h"

#include <errno.h>
#include <stdlib.h>

int tgt_pool_init(struct tgt_pool *p, struct ibv_pd *pd)
{
	int i;

	p->pd = pd;
	p->area = aligned_alloc(4096, (size_t)TGT_DEPTH * TGT_BUF_SIZE);
	if (!p->area)
		return -ENOMEM;
	/* OK: rdma-remote-access-overbroad -- no remote rights on a pool whose key never leaves */
	p->mr = ibv_reg_mr(pd, p->area, (size_t)TGT_DEPTH * TGT_BUF_SIZE, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- the pool is the local side of the target's own RDMA READ/WRITE
	if (!p->mr) {
		free(p->area);
		return -errno;
	}
	p->free = NULL;
	for (i = 0; i < TGT_DEPTH; i++) {
		p->bufs[i].data = p->area + (size_t)i * TGT_BUF_SIZE;
		p->bufs[i].next = p->free;
		p->free = &p->bufs[i];
	}
	return 0;
}

struct tgt_buf *tgt_buf_get(struct tgt_pool *p)
{
	struct tgt_buf *b = p->free;

	if (b)
		p->free = b->next;
	return b;
}

void tgt_buf_put(struct tgt_pool *p, struct tgt_buf *b)
{
	/* OK: rdma-invalidation-leak -- the pool MR has no remote rights; nothing to invalidate */
	b->next = p->free;
	p->free = b;
}

void tgt_pool_fini(struct tgt_pool *p)
{
	ibv_dereg_mr(p->mr);
	free(p->area);
}
