/*
 * mig: the RDMA data path of a VM live-migration mover.  mig_dst.c runs on
 * the destination host (exposes guest RAM chunks on request, cancels),
 * mig_src.c on the source host (writes dirty chunks).
 */
#ifndef MIG_H
#define MIG_H

#include <infiniband/verbs.h>
#include <stdint.h>

#define MIG_CHUNK_SHIFT	20
#define MIG_CHUNK	(1ul << MIG_CHUNK_SHIFT)
#define MIG_MAX_BLOCKS	32

struct mig_block {
	uint8_t        *host;
	uint64_t        len;
	unsigned int    nchunks;
	struct ibv_mr **chunk_mr;
	uint32_t       *remote_rkey;	/* source side */
	uint64_t        remote_host;	/* source side */
};

struct mig_ctx {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	int                 nblocks;
	struct mig_block    blocks[MIG_MAX_BLOCKS];
	unsigned int        since_signal;
	unsigned int        outstanding;
};

#endif
