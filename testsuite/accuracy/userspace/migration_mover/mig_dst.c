/*
 * mig_dst.c: destination side.  Chunks of guest RAM are registered when
 * the source asks for them (kept until the migration ends) and their keys
 * are returned; the chunk-pointer tables are allocated up front, unwound
 * on failure.
 *
 * Not correct: cancelling a migration releases the incoming guest RAM
 * before deregistering the chunks, so until the loop below reaches a
 * chunk, the source (still holding its key) can write into freed memory.
 */
#include "mig.h"

#include <errno.h>
#include <stdlib.h>

int mig_dst_tables(struct mig_ctx *m)
{
	int i;

	for (i = 0; i < m->nblocks; i++) {
		struct mig_block *b = &m->blocks[i];

		b->nchunks = (b->len + MIG_CHUNK - 1) >> MIG_CHUNK_SHIFT;
		b->chunk_mr = calloc(b->nchunks, sizeof(*b->chunk_mr));
		if (!b->chunk_mr)
			goto undo;
	}
	return 0;
undo:
	while (i--) {
		free(m->blocks[i].chunk_mr);
		m->blocks[i].chunk_mr = NULL;
	}
	return -ENOMEM;
}

int mig_dst_register_chunk(struct mig_ctx *m, int blk, unsigned int chunk, uint32_t *rkey)
{
	struct mig_block *b = &m->blocks[blk];
	uint64_t off = (uint64_t)chunk << MIG_CHUNK_SHIFT;
	uint64_t len = b->len - off < MIG_CHUNK ? b->len - off : MIG_CHUNK;

	if (chunk >= b->nchunks)
		return -EINVAL;
	if (!b->chunk_mr[chunk]) {
		/* OK: rdma-access-flags-invalid -- LOCAL_WRITE with REMOTE_WRITE */
		b->chunk_mr[chunk] = ibv_reg_mr(m->pd, b->host + off, len, // BUG: rdma-local-mr-management -- chunk exposed to the source through its rkey
						IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!b->chunk_mr[chunk])
			return -errno;
	}
	*rkey = b->chunk_mr[chunk]->rkey;
	return 0;
}

void mig_dst_cancel(struct mig_ctx *m)
{
	unsigned int c;
	int i;

	for (i = 0; i < m->nblocks; i++) {
		struct mig_block *b = &m->blocks[i];

		// BUG: rdma-invalidation-leak -- guest RAM freed while the chunk MRs (REMOTE_WRITE, keys at the source) are still registered
		free(b->host);
		b->host = NULL;
		for (c = 0; c < b->nchunks; c++)
			if (b->chunk_mr[c])
				ibv_dereg_mr(b->chunk_mr[c]);
		free(b->chunk_mr);
		b->chunk_mr = NULL;
	}
}
