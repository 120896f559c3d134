/*
 * yb_migrate_rdma.c - RDMA transport for live migration of guest RAM, in
 * the style of QEMU's migration/rdma.c.
 *
 * The destination exposes guest RAM to the source, which pushes pages
 * with RDMA WRITE.  Either the destination pins all RAM blocks up front
 * (pin-all: one MR per block, keys sent in the RAM_BLOCKS result) or the
 * source asks for each 1 MiB chunk with a REGISTER request and the
 * destination registers that chunk on first use and returns its rkey.
 * The source registers its side of each chunk the same way and keeps the
 * MR in block->pmr[] until cleanup.
 *
 * "unpinned" mode (for hosts that must not pin guest RAM for the whole
 * migration) registers the source chunk around each WRITE and drops it
 * when the WRITE completes.
 *
 * Known problems in this version: the control buffers carry remote write
 * that no peer is ever given a key for, the ODP retry of a chunk drops
 * LOCAL_WRITE, unpinned mode pays a registration per WRITE and loses the
 * MR when the post fails, and RAM hot-unplug frees a pin-all block with
 * its MR still registered.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-queue-cap-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked -- annotated for MR lifetime, registration placement and access rights only
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <errno.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define RDMA_REG_CHUNK_SHIFT		20
#define RDMA_REG_CHUNK_SIZE		(1UL << RDMA_REG_CHUNK_SHIFT)
#define RDMA_CONTROL_MAX_BUFFER		(512 * 1024)
#define RDMA_CONTROL_MAX_COMMANDS_PER_MESSAGE 4096

enum {
	RDMA_WRID_NONE = 0,
	RDMA_WRID_RDMA_WRITE = 1,
	RDMA_WRID_SEND_CONTROL = 2000,
	RDMA_WRID_RECV_CONTROL = 4000,
};

enum {
	RDMA_WRID_READY = 0,
	RDMA_WRID_DATA,
	RDMA_WRID_CONTROL,
	RDMA_WRID_MAX,
};

enum {
	RDMA_CONTROL_READY,
	RDMA_CONTROL_RAM_BLOCKS_REQUEST,
	RDMA_CONTROL_RAM_BLOCKS_RESULT,
	RDMA_CONTROL_REGISTER_REQUEST,
	RDMA_CONTROL_REGISTER_RESULT,
};

typedef struct RDMAControlHeader {
	uint32_t len;
	uint32_t type;
	uint32_t repeat;
	uint32_t padding;
} __attribute__((packed)) RDMAControlHeader;

typedef struct RDMARegister {
	uint64_t chunk;
	uint32_t current_index;
	uint32_t padding;
} __attribute__((packed)) RDMARegister;

typedef struct RDMARegisterResult {
	uint32_t rkey;
	uint32_t padding;
	uint64_t host_addr;
} __attribute__((packed)) RDMARegisterResult;

typedef struct RDMADestBlock {
	uint64_t remote_host_addr;
	uint64_t length;
	uint32_t remote_rkey;
	uint32_t padding;
} __attribute__((packed)) RDMADestBlock;

typedef struct RDMALocalBlock {
	char		*block_name;
	uint8_t		*local_host_addr;
	uint64_t	remote_host_addr;
	uint64_t	length;
	struct ibv_mr	**pmr;		/* per-chunk MRs */
	struct ibv_mr	*mr;		/* whole-block MR (pin-all) */
	uint32_t	*remote_keys;	/* per-chunk rkeys of the peer */
	uint32_t	remote_rkey;	/* whole-block rkey of the peer */
	int		index;
	int		nb_chunks;
} RDMALocalBlock;

typedef struct RDMAWorkRequestData {
	uint8_t		control[RDMA_CONTROL_MAX_BUFFER];
	struct ibv_mr	*control_mr;
	int		control_len;
} RDMAWorkRequestData;

typedef struct RDMAContext {
	struct rdma_cm_id	*cm_id;
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	RDMAWorkRequestData	wr_data[RDMA_WRID_MAX];
	bool			pin_all;
	bool			unpinned;
	bool			odp;
	int			nb_blocks;
	RDMALocalBlock		**blocks;
	uint64_t		total_registrations;
	int			error_state;
} RDMAContext;

static inline uint64_t ram_chunk_index(const uint8_t *start, const uint8_t *host)
{
	return ((uintptr_t)host - (uintptr_t)start) >> RDMA_REG_CHUNK_SHIFT;
}

static inline uint8_t *ram_chunk_start(const RDMALocalBlock *block, uint64_t i)
{
	return block->local_host_addr + (i << RDMA_REG_CHUNK_SHIFT);
}

static inline uint8_t *ram_chunk_end(const RDMALocalBlock *block, uint64_t i)
{
	uint8_t *end = ram_chunk_start(block, i) + RDMA_REG_CHUNK_SIZE;
	uint8_t *block_end = block->local_host_addr + block->length;

	return end > block_end ? block_end : end;
}

static int qemu_rdma_reg_control(RDMAContext *rdma, int idx)
{
	// BUG: rdma-remote-access-overbroad -- control buffers are only SEND/RECV buffers; their rkey is never sent to the peer
	rdma->wr_data[idx].control_mr = ibv_reg_mr(rdma->pd,
			rdma->wr_data[idx].control, RDMA_CONTROL_MAX_BUFFER,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (rdma->wr_data[idx].control_mr) {
		rdma->total_registrations++;
		return 0;
	}
	fprintf(stderr, "qemu_rdma_reg_control failed\n");
	return -1;
}

static int qemu_rdma_block_for_wrid(RDMAContext *rdma, uint64_t wrid)
{
	struct ibv_wc wc;
	int ret;

	for (;;) {
		ret = ibv_poll_cq(rdma->cq, 1, &wc);
		if (ret < 0)
			return -1;
		if (ret == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "wrid %lu: %s\n", (unsigned long)wc.wr_id,
				ibv_wc_status_str(wc.status));
			rdma->error_state = -EIO;
			return -1;
		}
		if (wc.wr_id == wrid)
			return 0;
	}
}

static int qemu_rdma_post_send_control(RDMAContext *rdma, uint8_t *buf,
				       RDMAControlHeader *head)
{
	RDMAWorkRequestData *wr = &rdma->wr_data[RDMA_WRID_CONTROL];
	struct ibv_send_wr *bad_wr;
	struct ibv_sge sge = {
		.addr = (uintptr_t)wr->control,
		.length = head->len + sizeof(RDMAControlHeader),
		.lkey = wr->control_mr->lkey,
	};
	struct ibv_send_wr send_wr = {
		.wr_id = RDMA_WRID_SEND_CONTROL,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
		.sg_list = &sge,
		.num_sge = 1,
	};

	memcpy(wr->control, head, sizeof(*head));
	if (buf)
		memcpy(wr->control + sizeof(*head), buf, head->len);
	if (ibv_post_send(rdma->qp, &send_wr, &bad_wr))
		return -1;
	return qemu_rdma_block_for_wrid(rdma, RDMA_WRID_SEND_CONTROL);
}

/* destination, pin-all: every RAM block at once, keys go back in RAM_BLOCKS_RESULT */
static int qemu_rdma_reg_whole_ram_blocks(RDMAContext *rdma)
{
	int i;

	for (i = 0; i < rdma->nb_blocks; i++) {
		RDMALocalBlock *block = rdma->blocks[i];
		int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

		// OK: rdma-remote-access-overbroad, rdma-registration-in-datapath -- the rkey is sent in RAM_BLOCKS_RESULT; the whole table is pinned at once
		block->mr = ibv_reg_mr(rdma->pd, block->local_host_addr, block->length, access);
		if (!block->mr && errno == ENOTSUP && rdma->odp) {
			access |= IBV_ACCESS_ON_DEMAND;
			// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- ODP retry keeps LOCAL_WRITE; one block, not the address space
			block->mr = ibv_reg_mr(rdma->pd, block->local_host_addr, block->length, access);
		}
		if (!block->mr) {
			perror("Failed to register local dest ram block");
			goto err;
		}
		rdma->total_registrations++;
	}
	return 0;

err:
	for (i--; i >= 0; i--) { // OK: rdma-mr-leak -- block i holds no MR; every earlier one is released
		ibv_dereg_mr(rdma->blocks[i]->mr);
		rdma->blocks[i]->mr = NULL;
		rdma->total_registrations--;
	}
	return -1;
}

/*
 * Keys of the chunk that holds host_addr, registering it on first use.
 * The destination passes rkey (the peer will write into the chunk), the
 * source does not.
 */
static int qemu_rdma_register_and_get_keys(RDMAContext *rdma, RDMALocalBlock *block,
					   uint8_t *host_addr, uint32_t *lkey,
					   uint32_t *rkey, uint64_t chunk)
{
	uint8_t *chunk_start, *chunk_end;
	int access;

	if (block->mr) {
		if (lkey)
			*lkey = block->mr->lkey;
		if (rkey)
			*rkey = block->mr->rkey;
		return 0;
	}

	if (!block->pmr[chunk]) {
		chunk_start = ram_chunk_start(block, chunk);
		chunk_end = ram_chunk_end(block, chunk);
		access = rkey ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0;
		// OK: rdma-registration-in-datapath, rdma-remote-access-overbroad -- first use of the chunk, kept in block->pmr[]; remote write only for the destination, which returns the rkey
		block->pmr[chunk] = ibv_reg_mr(rdma->pd, chunk_start, chunk_end - chunk_start, access);
		if (!block->pmr[chunk] && errno == ENOTSUP && rdma->odp) {
			access = IBV_ACCESS_ON_DEMAND | (rkey ? IBV_ACCESS_REMOTE_WRITE : 0);
			// BUG: rdma-access-flags-invalid -- the ODP retry rebuilt the flags and lost LOCAL_WRITE on the destination path
			block->pmr[chunk] = ibv_reg_mr(rdma->pd, chunk_start, // OK: rdma-remote-access-overbroad -- ODP of one chunk whose rkey the destination returns
						       chunk_end - chunk_start, access);
		}
		if (!block->pmr[chunk]) {
			perror("Failed to register chunk!");
			return -1;
		}
		rdma->total_registrations++;
	}

	if (lkey)
		*lkey = block->pmr[chunk]->lkey;
	if (rkey)
		*rkey = block->pmr[chunk]->rkey;
	return 0;
}

/* destination: REGISTER request from the source, answered with the rkeys */
static int qemu_rdma_registration_handle_register(RDMAContext *rdma,
						  RDMAControlHeader *head,
						  RDMARegister *regs)
{
	RDMARegisterResult results[64];
	RDMAControlHeader reply = { .type = RDMA_CONTROL_REGISTER_RESULT };
	uint32_t count;

	if (head->repeat > 64)
		return -EINVAL;
	for (count = 0; count < head->repeat; count++) {
		RDMARegister *reg = &regs[count];
		RDMALocalBlock *block;
		uint8_t *host_addr;
		uint32_t rkey;

		if (reg->current_index >= (uint32_t)rdma->nb_blocks)
			return -EINVAL; // OK: rdma-mr-leak -- chunks registered for earlier entries stay cached in block->pmr[] until cleanup
		block = rdma->blocks[reg->current_index];
		if (reg->chunk >= (uint64_t)block->nb_chunks)
			return -EINVAL;
		host_addr = ram_chunk_start(block, reg->chunk);
		if (qemu_rdma_register_and_get_keys(rdma, block, host_addr, NULL,
						    &rkey, reg->chunk))
			return -1;
		results[count].rkey = htobe32(rkey);
		results[count].host_addr = htobe64((uintptr_t)host_addr);
	}
	reply.len = head->repeat * sizeof(results[0]);
	reply.repeat = head->repeat;
	return qemu_rdma_post_send_control(rdma, (uint8_t *)results, &reply);
}

/* destination: the source asked for the block layout */
static int qemu_rdma_registration_handle_ram_blocks(RDMAContext *rdma)
{
	RDMADestBlock dest_blocks[64];
	RDMAControlHeader blocks = { .type = RDMA_CONTROL_RAM_BLOCKS_RESULT, .repeat = 1 };
	int i;

	if (rdma->nb_blocks > 64)
		return -EINVAL;
	if (rdma->pin_all && qemu_rdma_reg_whole_ram_blocks(rdma))
		return -1;

	for (i = 0; i < rdma->nb_blocks; i++) {
		RDMALocalBlock *block = rdma->blocks[i];

		dest_blocks[i].remote_host_addr = htobe64((uintptr_t)block->local_host_addr);
		dest_blocks[i].length = htobe64(block->length);
		dest_blocks[i].remote_rkey = block->mr ? htobe32(block->mr->rkey) : 0;
	}
	blocks.len = rdma->nb_blocks * sizeof(RDMADestBlock);
	return qemu_rdma_post_send_control(rdma, (uint8_t *)dest_blocks, &blocks);
}

/* unpinned mode: the source chunk is registered only for one WRITE */
static struct ibv_mr *qemu_rdma_reg_chunk_local(RDMAContext *rdma, uint8_t *start,
						size_t len)
{
	struct ibv_mr *mr;

	/* the source only reads the chunk: local read is always granted */
	mr = ibv_reg_mr(rdma->pd, start, len, 0); // BUG: rdma-registration-in-datapath -- called for every WRITE of the unpinned path
	if (!mr) {
		fprintf(stderr, "unpinned chunk %p+%zu: %s\n", (void *)start, len,
			strerror(errno));
		return NULL;
	}
	return mr; // OK: rdma-mr-leak -- ownership goes to the caller
}

static int qemu_rdma_write_unpinned(RDMAContext *rdma, RDMALocalBlock *block,
				    uint64_t chunk, uint64_t offset, uint64_t len)
{
	struct ibv_send_wr *bad_wr;
	struct ibv_sge sge;
	struct ibv_send_wr send_wr = { 0 };
	struct ibv_mr *mr;
	int ret;

	mr = qemu_rdma_reg_chunk_local(rdma, block->local_host_addr + offset, len);
	if (!mr)
		return -1;

	sge.addr = (uintptr_t)(block->local_host_addr + offset);
	sge.length = (uint32_t)len;
	sge.lkey = mr->lkey;
	send_wr.wr_id = RDMA_WRID_RDMA_WRITE;
	send_wr.opcode = IBV_WR_RDMA_WRITE;
	send_wr.send_flags = IBV_SEND_SIGNALED;
	send_wr.sg_list = &sge;
	send_wr.num_sge = 1;
	send_wr.wr.rdma.rkey = block->remote_keys[chunk] ? block->remote_keys[chunk]
							  : block->remote_rkey;
	send_wr.wr.rdma.remote_addr = block->remote_host_addr + offset;

	ret = ibv_post_send(rdma->qp, &send_wr, &bad_wr);
	if (ret) {
		fprintf(stderr, "unpinned write failed: %s\n", strerror(ret));
		return -ret; // BUG: rdma-mr-leak -- the chunk's MR is dropped when the post fails
	}
	ret = qemu_rdma_block_for_wrid(rdma, RDMA_WRID_RDMA_WRITE);
	ibv_dereg_mr(mr); // BUG: rdma-registration-in-datapath -- and deregistered after every WRITE
	return ret;
}

/* source: push [offset, offset + len) of a block, len within one chunk */
static int qemu_rdma_write_one(RDMAContext *rdma, int current_index,
			       uint64_t offset, uint64_t len)
{
	RDMALocalBlock *block = rdma->blocks[current_index];
	uint8_t *host = block->local_host_addr + offset;
	uint64_t chunk = ram_chunk_index(block->local_host_addr, host);
	struct ibv_send_wr send_wr = { 0 }, *bad_wr;
	struct ibv_sge sge;
	uint32_t lkey;

	if (rdma->unpinned)
		return qemu_rdma_write_unpinned(rdma, block, chunk, offset, len);

	if (!rdma->pin_all && !block->remote_keys[chunk]) {
		RDMARegister reg = { .chunk = chunk, .current_index = current_index };
		RDMAControlHeader head = { .len = sizeof(reg),
					   .type = RDMA_CONTROL_REGISTER_REQUEST,
					   .repeat = 1 };

		if (qemu_rdma_post_send_control(rdma, (uint8_t *)&reg, &head))
			return -1;
		/* the RECV handler fills block->remote_keys[chunk] from the result */
	}

	if (qemu_rdma_register_and_get_keys(rdma, block, host, &lkey, NULL, chunk))
		return -1;

	sge.addr = (uintptr_t)host;
	sge.length = (uint32_t)len;
	sge.lkey = lkey;
	send_wr.wr_id = RDMA_WRID_RDMA_WRITE;
	send_wr.opcode = IBV_WR_RDMA_WRITE;
	send_wr.send_flags = IBV_SEND_SIGNALED;
	send_wr.sg_list = &sge;
	send_wr.num_sge = 1;
	send_wr.wr.rdma.remote_addr = block->remote_host_addr + offset;
	send_wr.wr.rdma.rkey = rdma->pin_all ? block->remote_rkey : block->remote_keys[chunk];
	if (ibv_post_send(rdma->qp, &send_wr, &bad_wr))
		return -1;
	return qemu_rdma_block_for_wrid(rdma, RDMA_WRID_RDMA_WRITE);
}

/* RAM hot-unplug while migrating */
static void rdma_delete_block(RDMAContext *rdma, int index)
{
	RDMALocalBlock *block = rdma->blocks[index];
	int j;

	if (block->pmr) {
		for (j = 0; j < block->nb_chunks; j++) {
			if (!block->pmr[j])
				continue;
			ibv_dereg_mr(block->pmr[j]);
			rdma->total_registrations--;
		}
		free(block->pmr);
	}
	free(block->remote_keys);
	free(block->block_name);
	free(block); // BUG: rdma-mr-leak -- a pin-all block still holds block->mr here
	memmove(&rdma->blocks[index], &rdma->blocks[index + 1],
		(rdma->nb_blocks - index - 1) * sizeof(rdma->blocks[0]));
	rdma->nb_blocks--;
}

static void qemu_rdma_cleanup(RDMAContext *rdma)
{
	int idx, i, j;

	for (idx = 0; idx < RDMA_WRID_MAX; idx++) {
		if (rdma->wr_data[idx].control_mr) {
			rdma->total_registrations--;
			ibv_dereg_mr(rdma->wr_data[idx].control_mr);
			rdma->wr_data[idx].control_mr = NULL;
		}
	}
	for (i = 0; i < rdma->nb_blocks; i++) {
		RDMALocalBlock *block = rdma->blocks[i];

		if (block->mr)
			ibv_dereg_mr(block->mr);
		for (j = 0; block->pmr && j < block->nb_chunks; j++)
			if (block->pmr[j])
				ibv_dereg_mr(block->pmr[j]);
		free(block->pmr);
		free(block->remote_keys);
		free(block->block_name);
		free(block);
	}
	free(rdma->blocks);
	rdma->blocks = NULL;
	rdma->nb_blocks = 0;
	if (rdma->qp)
		rdma_destroy_qp(rdma->cm_id);
	if (rdma->cq)
		ibv_destroy_cq(rdma->cq);
	if (rdma->pd)
		ibv_dealloc_pd(rdma->pd);
}

int qemu_rdma_init_control(RDMAContext *rdma)
{
	int idx;

	for (idx = 0; idx < RDMA_WRID_MAX; idx++) {
		if (qemu_rdma_reg_control(rdma, idx)) {
			fprintf(stderr, "rdma migration: error registering %d control!\n", idx);
			goto err;
		}
	}
	return 0;

err:
	qemu_rdma_cleanup(rdma); // OK: rdma-mr-leak -- control MRs registered so far are released by the cleanup
	return -1;
}

int qemu_rdma_dest_dispatch(RDMAContext *rdma, RDMAControlHeader *head, void *data)
{
	switch (head->type) {
	case RDMA_CONTROL_RAM_BLOCKS_REQUEST:
		return qemu_rdma_registration_handle_ram_blocks(rdma);
	case RDMA_CONTROL_REGISTER_REQUEST:
		return qemu_rdma_registration_handle_register(rdma, head, data);
	default:
		return -EINVAL;
	}
}

int qemu_rdma_source_save_page(RDMAContext *rdma, int block_index,
			       uint64_t offset, uint64_t len)
{
	if (block_index < 0 || block_index >= rdma->nb_blocks || rdma->error_state)
		return -EIO;
	if (offset + len > rdma->blocks[block_index]->length)
		return -EINVAL;
	return qemu_rdma_write_one(rdma, block_index, offset, len);
}

void qemu_rdma_unplug(RDMAContext *rdma, const char *name)
{
	int i;

	for (i = 0; i < rdma->nb_blocks; i++) {
		if (!strcmp(rdma->blocks[i]->block_name, name)) {
			rdma_delete_block(rdma, i);
			return;
		}
	}
}
