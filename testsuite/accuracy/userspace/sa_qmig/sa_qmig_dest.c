/*
 * sa_qmig_dest.c - destination side of the RDMA migration channel; see
 * sa_qmig.h.
 *
 * Every destination registration grants REMOTE_WRITE and its key is sent
 * to the source: the pin-all blocks (RAM_BLOCKS_RESULT), the per-chunk
 * registrations (REGISTER_RESULT) and the dirty-bitmap buffer (accept
 * private data).  The per-chunk pmr tables are allocated with the RAM block
 * list, before the channel is set up.
 *
 * Wrong: a REGISTER_REQUEST for a chunk past the end of its block leaks the
 * registration made before the range check; when the connection is never
 * established after rdma_accept(), the bitmap buffer is freed while the
 * source holds its key and only deregistered afterwards.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sa_qmig.h"

#define error_report(fmt, ...) fprintf(stderr, "rdma dest: " fmt "\n", ##__VA_ARGS__)

/* the incoming migration, for the monitor's "info migrate" */
static RDMAContext *qemu_rdma_incoming;

static void qemu_rdma_advise_prefetch_mr(struct ibv_pd *pd, struct ibv_mr *mr,
					 void *addr, uint64_t len)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)addr, .length = (uint32_t)len, .lkey = mr->lkey,
	};

	if (ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			  IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1))
		error_report("prefetch of %p failed, continuing", addr);
}

static struct ibv_mr *qemu_rdma_dest_reg(RDMAContext *rdma, void *addr, uint64_t len)
{
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *mr;

	mr = ibv_reg_mr(rdma->pd, addr, len, access);
	if (!mr && errno == EOPNOTSUPP) {
		access |= IBV_ACCESS_ON_DEMAND;
		mr = ibv_reg_mr(rdma->pd, addr, len, access);
		if (mr)
			qemu_rdma_advise_prefetch_mr(rdma->pd, mr, addr, len);
	}
	return mr;
}

static int qemu_rdma_reg_whole_ram_blocks(RDMAContext *rdma)
{
	RDMALocalBlocks *local = &rdma->local_ram_blocks;
	int i;

	for (i = 0; i < local->nb_blocks; i++) {
		local->block[i].mr = qemu_rdma_dest_reg(rdma, local->block[i].local_host_addr,
							local->block[i].length);
		if (!local->block[i].mr) {
			error_report("failed to register ram block %s", local->block[i].block_name);
			break;
		}
	}
	if (i >= local->nb_blocks)
		return 0;

	for (i--; i >= 0; i--) {
		ibv_dereg_mr(local->block[i].mr);
		local->block[i].mr = NULL;
	}
	return -1;	/* OK: rdma-mr-leak -- block i failed to register; every earlier block is deregistered above */
}

static void qemu_rdma_dest_unreg_blocks(RDMAContext *rdma)
{
	RDMALocalBlocks *local = &rdma->local_ram_blocks;
	int i;

	for (i = 0; i < local->nb_blocks; i++) {
		if (!local->block[i].mr)
			continue;
		ibv_dereg_mr(local->block[i].mr);
		local->block[i].mr = NULL;
	}
}

static int qemu_rdma_dest_send_ram_blocks(RDMAContext *rdma)
{
	RDMALocalBlocks *local = &rdma->local_ram_blocks;
	RDMAControlHeader head = { .type = RDMA_CONTROL_RAM_BLOCKS_RESULT, .repeat = 1 };
	RDMADestBlock *blocks;
	int i, ret;

	blocks = calloc(local->nb_blocks, sizeof(*blocks));
	if (!blocks)
		return -ENOMEM;
	for (i = 0; i < local->nb_blocks; i++) {
		blocks[i].remote_host_addr = (uintptr_t)local->block[i].local_host_addr;
		blocks[i].offset = local->block[i].offset;
		blocks[i].length = local->block[i].length;
		blocks[i].remote_rkey = rdma->pin_all ? local->block[i].mr->rkey : 0;
	}
	head.len = (uint32_t)(local->nb_blocks * sizeof(*blocks));
	ret = qemu_rdma_post_send_control(rdma, blocks, &head);
	free(blocks);
	return ret;
}

static int qemu_rdma_dest_register_chunk(RDMAContext *rdma, const RDMARegister *reg,
					 RDMARegisterResult *res)
{
	RDMALocalBlock *block;
	uint8_t *host, *start, *end;
	struct ibv_mr *mr;
	int chunk;

	if (reg->current_index >= (uint32_t)rdma->local_ram_blocks.nb_blocks)
		return -EINVAL;
	block = &rdma->local_ram_blocks.block[reg->current_index];
	host = block->local_host_addr + (reg->current_addr - block->offset);
	chunk = (int)((host - block->local_host_addr) >> RDMA_REG_CHUNK_SHIFT);
	start = ram_chunk_start(block, chunk);
	end = start + (uint64_t)reg->chunks * RDMA_REG_CHUNK_SIZE;

	if (chunk < block->nb_chunks && block->pmr[chunk]) {
		res->rkey = block->pmr[chunk]->rkey;
		res->host_addr = (uintptr_t)start;
		return 0;
	}

	mr = qemu_rdma_dest_reg(rdma, start, end - start);
	if (!mr) {
		error_report("cannot register chunk %d of %s", chunk, block->block_name);
		return -1;
	}
	if (end > block->local_host_addr + block->length || chunk >= block->nb_chunks) {
		error_report("register request past the end of %s", block->block_name);
		return -EINVAL;	/* BUG: rdma-mr-leak -- 'mr' was registered before the range check and is neither stored nor released */
	}
	block->pmr[chunk] = mr;
	res->rkey = mr->rkey;
	res->host_addr = (uintptr_t)start;
	return 0;
}

static int qemu_rdma_dest_unregister_chunk(RDMAContext *rdma, const RDMARegister *reg)
{
	RDMALocalBlock *block = &rdma->local_ram_blocks.block[reg->current_index];
	int chunk = (int)reg->current_addr;

	if (chunk >= block->nb_chunks || !block->pmr[chunk])
		return -EINVAL;
	if (ibv_dereg_mr(block->pmr[chunk]))
		return -errno;
	block->pmr[chunk] = NULL;	/* OK: rdma-mr-leak -- deregistered just above */
	return 0;
}

int qemu_rdma_dest_handle_control(RDMAContext *rdma)
{
	RDMAControlHeader head = { .repeat = 1 };
	RDMARegisterResult res;
	void *payload;
	uint32_t len;
	int type;

	type = qemu_rdma_wait_control(rdma, RDMA_CONTROL_NONE, &payload, &len);
	switch (type) {
	case RDMA_CONTROL_RAM_BLOCKS_REQUEST:
		return qemu_rdma_dest_send_ram_blocks(rdma);
	case RDMA_CONTROL_REGISTER_REQUEST:
		if (qemu_rdma_dest_register_chunk(rdma, payload, &res))
			return -1;
		head.type = RDMA_CONTROL_REGISTER_RESULT;
		head.len = sizeof(res);
		return qemu_rdma_post_send_control(rdma, &res, &head);
	case RDMA_CONTROL_UNREGISTER_REQUEST:
		if (qemu_rdma_dest_unregister_chunk(rdma, payload))
			return -1;
		head.type = RDMA_CONTROL_UNREGISTER_FINISHED;
		head.len = 0;
		return qemu_rdma_post_send_control(rdma, NULL, &head);
	default:
		return -1;
	}
}

int qemu_rdma_dest_accept(RDMAContext *rdma)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param cp = { .responder_resources = 2, .private_data_len = sizeof(RDMACapabilities) };
	RDMACapabilities cap = { .version = 1 };
	struct rdma_cm_event *ev;
	int established;

	attr.send_cq = attr.recv_cq = rdma->cq;
	if (rdma_create_qp(rdma->cm_id, rdma->pd, &attr))
		return -1;
	rdma->qp = rdma->cm_id->qp;
	if (qemu_rdma_init_control(rdma))
		goto err_qp;
	if (rdma->pin_all && qemu_rdma_reg_whole_ram_blocks(rdma))
		goto err_control;

	if (posix_memalign(&rdma->bitmap_buf, 4096, rdma->bitmap_len))
		goto err_blocks;
	rdma->bitmap_mr = qemu_rdma_dest_reg(rdma, rdma->bitmap_buf, rdma->bitmap_len);
	if (!rdma->bitmap_mr) {
		free(rdma->bitmap_buf);
		rdma->bitmap_buf = NULL;
		goto err_blocks;
	}

	cap.bitmap_addr = (uintptr_t)rdma->bitmap_buf;
	cap.bitmap_rkey = rdma->bitmap_mr->rkey;
	cp.private_data = &cap;
	if (rdma_accept(rdma->cm_id, &cp)) {
		error_report("rdma_accept failed");
		goto err_accept;
	}
	if (rdma_get_cm_event(rdma->channel, &ev))
		goto err_established;
	established = ev->event == RDMA_CM_EVENT_ESTABLISHED;
	rdma_ack_cm_event(ev);
	if (!established)
		goto err_established;

	qemu_rdma_incoming = rdma;
	return 0;

err_established:
	error_report("source never established the connection");
	free(rdma->bitmap_buf);	/* BUG: rdma-invalidation-leak -- the source got bitmap_rkey in the accept private data; the buffer is freed before bitmap_mr is deregistered */
	rdma->bitmap_buf = NULL;
	ibv_dereg_mr(rdma->bitmap_mr);
	rdma->bitmap_mr = NULL;
	goto err_blocks;
err_accept:
	ibv_dereg_mr(rdma->bitmap_mr);
	rdma->bitmap_mr = NULL;
	free(rdma->bitmap_buf);	/* OK: rdma-invalidation-leak -- deregistered before the buffer is freed */
	rdma->bitmap_buf = NULL;
err_blocks:
	qemu_rdma_dest_unreg_blocks(rdma);
err_control:
	qemu_rdma_free_control(rdma);
err_qp:
	rdma_destroy_qp(rdma->cm_id);
	rdma->qp = NULL;
	return -1;
}

void qemu_rdma_dest_cleanup(RDMAContext *rdma)
{
	RDMALocalBlocks *local = &rdma->local_ram_blocks;
	int i, j;

	for (i = 0; i < local->nb_blocks; i++) {
		RDMALocalBlock *block = &local->block[i];

		for (j = 0; block->pmr && j < block->nb_chunks; j++) {
			if (!block->pmr[j])
				continue;
			ibv_dereg_mr(block->pmr[j]);
			block->pmr[j] = NULL;
		}
	}
	qemu_rdma_dest_unreg_blocks(rdma);
	if (rdma->bitmap_mr) {
		ibv_dereg_mr(rdma->bitmap_mr);
		rdma->bitmap_mr = NULL;
		free(rdma->bitmap_buf);	/* OK: rdma-invalidation-leak -- bitmap_mr is deregistered first */
		rdma->bitmap_buf = NULL;
	}
	qemu_rdma_free_control(rdma);
	if (rdma->cm_id && rdma->qp) {
		rdma_destroy_qp(rdma->cm_id);
		rdma->qp = NULL;
	}
	if (qemu_rdma_incoming == rdma)
		qemu_rdma_incoming = NULL;
}
