/*
 * RAM-block mover for live migration over RDMA (QEMU migration/rdma.c
 * style).  The destination exposes guest RAM, the source RDMA-WRITEs dirty
 * chunks into it.
 *
 * Two registration modes on the destination:
 *  - pin-all: every RAM block registered at setup (falling back to ODP for
 *    that block when pinning is not supported) and the keys sent to the
 *    source in one RAM_BLOCKS message;
 *  - on demand: the source asks for each chunk with a REGISTER request and
 *    the destination registers the chunk once, keeps it in block->pmr[],
 *    and answers with its rkey.
 * The source registers the chunks it writes from (lkey only, access 0) on
 * first use and keeps them too.
 *
 * Correct: the pin-all loop unwinds what it registered; the ODP fallback
 * registers one block (not the address space) and its key is sent; chunk
 * registrations are first-use caches, not per-I/O registration.
 * Not correct: the on-demand destination path builds its flags without
 * LOCAL_WRITE, so every chunk registration fails with EINVAL.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RDMA_CHUNK_SHIFT	20
#define RDMA_CHUNK_SIZE		(1ul << RDMA_CHUNK_SHIFT)
#define RDMA_SIGNALED_SEND_MAX	512
#define RDMA_MAX_BLOCKS		64

typedef struct RDMALocalBlock {
	uint8_t        *local_host_addr;
	uint64_t        length;
	int             nb_chunks;
	struct ibv_mr  *mr;		/* pin-all */
	struct ibv_mr **pmr;		/* per chunk, on demand */
	uint32_t       *remote_keys;	/* source side: keys per chunk */
	uint64_t        remote_host_addr;
} RDMALocalBlock;

typedef struct RDMARemoteBlock {
	uint64_t remote_host_addr;
	uint64_t offset;
	uint64_t length;
	uint32_t remote_rkey;
	uint32_t padding;
} RDMARemoteBlock;

typedef struct RDMAContext {
	struct ibv_context *verbs;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	bool                pin_all;
	bool                odp_capable;
	int                 nb_blocks;
	RDMALocalBlock      blocks[RDMA_MAX_BLOCKS];
	RDMARemoteBlock     wire_blocks[RDMA_MAX_BLOCKS];
	int                 nb_sent;
} RDMAContext;

int qemu_rdma_alloc_qp(RDMAContext *rdma)
{
	struct ibv_qp_init_attr attr = { 0 };

	attr.cap.max_send_wr = RDMA_SIGNALED_SEND_MAX;	/* OK: rdma-queue-cap-unchecked -- 512 is within every device's limit */
	attr.cap.max_recv_wr = 3;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.send_cq = rdma->cq;
	attr.recv_cq = rdma->cq;
	attr.qp_type = IBV_QPT_RC;

	rdma->qp = ibv_create_qp(rdma->pd, &attr);
	return rdma->qp ? 0 : -1;
}

/* destination, pin-all mode */
int qemu_rdma_reg_whole_ram_blocks(RDMAContext *rdma)
{
	int i;

	for (i = 0; i < rdma->nb_blocks; i++) {
		RDMALocalBlock *b = &rdma->blocks[i];
		int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

		b->mr = ibv_reg_mr(rdma->pd, b->local_host_addr, b->length, access); // BUG: rdma-local-mr-management -- guest RAM exposed to the source through this MR's rkey
		if (!b->mr && errno == ENOTSUP && rdma->odp_capable) {
			/* OK: rdma-remote-access-overbroad -- ODP of one RAM block whose key is sent, not of the address space */
			b->mr = ibv_reg_mr(rdma->pd, b->local_host_addr, b->length, // BUG: rdma-local-mr-management -- guest RAM exposed to the source through this MR's rkey
					   access | IBV_ACCESS_ON_DEMAND);
			if (b->mr)
				ibv_advise_mr(rdma->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
					      IB_UVERBS_ADVISE_MR_FLAG_FLUSH,
					      &(struct ibv_sge){
						      .addr = (uintptr_t)b->local_host_addr,
						      .length = (uint32_t)b->length,
						      .lkey = b->mr->lkey },
					      1);
		}
		if (!b->mr) {
			perror("Failed to register local dest ram block");
			goto err;
		}
		rdma->wire_blocks[i].remote_host_addr = htobe64((uintptr_t)b->local_host_addr);
		rdma->wire_blocks[i].length = htobe64(b->length);
		rdma->wire_blocks[i].remote_rkey = htobe32(b->mr->rkey);
	}
	return 0;

err:
	/* OK: rdma-mr-leak -- every block registered before the failure is deregistered */
	for (i--; i >= 0; i--) {
		ibv_dereg_mr(rdma->blocks[i].mr);
		rdma->blocks[i].mr = NULL;
	}
	return -1;
}

/* destination, on-demand mode: answer a REGISTER request for one chunk */
int qemu_rdma_register_chunk_for_source(RDMAContext *rdma, int block_index,
					uint64_t chunk, uint32_t *rkey)
{
	RDMALocalBlock *b = &rdma->blocks[block_index];
	uint8_t *start = b->local_host_addr + (chunk << RDMA_CHUNK_SHIFT);
	uint64_t len = RDMA_CHUNK_SIZE;
	int access = IBV_ACCESS_REMOTE_WRITE;

	if (chunk >= (uint64_t)b->nb_chunks)
		return -EINVAL;
	if (start + len > b->local_host_addr + b->length)
		len = b->local_host_addr + b->length - start;
	if (rdma->odp_capable)
		access |= IBV_ACCESS_ON_DEMAND;

	/* OK: rdma-registration-in-datapath -- chunks are registered once and kept in b->pmr[] */
	if (!b->pmr[chunk]) {
		// BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE; every on-demand chunk registration fails with EINVAL
		b->pmr[chunk] = ibv_reg_mr(rdma->pd, start, len, access); // BUG: rdma-local-mr-management -- chunk exposed to the source through its rkey
		if (!b->pmr[chunk])
			return -errno;
	}
	*rkey = b->pmr[chunk]->rkey;
	return 0;
}

/* source side: write one chunk into the destination */
int qemu_rdma_write_one(RDMAContext *rdma, int block_index, uint64_t chunk,
			uint64_t offset, uint32_t length)
{
	RDMALocalBlock *b = &rdma->blocks[block_index];
	uint8_t *chunk_start = b->local_host_addr + (chunk << RDMA_CHUNK_SHIFT);
	struct ibv_sge sge;
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;
	int ret;

	/* OK: rdma-registration-in-datapath -- first-use registration kept in b->pmr[] */
	if (!b->pmr[chunk]) {
		/* OK: rdma-access-flags-invalid -- access 0: the source only reads its memory locally */
		b->pmr[chunk] = ibv_reg_mr(rdma->pd, chunk_start, RDMA_CHUNK_SIZE, 0); // BUG: rdma-local-mr-management -- lkey addresses the ULP's own RDMA WRITE
		if (!b->pmr[chunk])
			return -errno;
	}

	sge.addr = (uintptr_t)(b->local_host_addr + offset);
	sge.length = length;
	sge.lkey = b->pmr[chunk]->lkey;

	wr.wr_id = ((uint64_t)block_index << 32) | chunk;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.rkey = b->remote_keys[chunk];
	wr.wr.rdma.remote_addr = b->remote_host_addr + offset;

	ret = ibv_post_send(rdma->qp, &wr, &bad);
	if (ret)
		return -ret;
	rdma->nb_sent++;
	if (rdma->nb_sent < RDMA_SIGNALED_SEND_MAX)
		return 0;
	do
		ret = ibv_poll_cq(rdma->cq, 1, &wc);
	while (ret == 0);
	if (ret < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	rdma->nb_sent--;
	return 0;
}

void qemu_rdma_cleanup_blocks(RDMAContext *rdma)
{
	int i, j;

	for (i = 0; i < rdma->nb_blocks; i++) {
		RDMALocalBlock *b = &rdma->blocks[i];

		if (b->mr)
			ibv_dereg_mr(b->mr);
		for (j = 0; b->pmr && j < b->nb_chunks; j++)
			if (b->pmr[j])
				ibv_dereg_mr(b->pmr[j]);
		free(b->pmr);
		b->pmr = NULL;
		b->mr = NULL;
	}
}
