/*
 * sa_qmig_src.c - control channel helpers (used by both sides) and the
 * source side of the RDMA migration channel; see sa_qmig.h.
 *
 * Source registrations never grant remote rights: the chunks it writes from
 * are registered with access 0 (ODP on ENOTSUP) and the staging buffer with
 * LOCAL_WRITE.  Chunks are deregistered once their WRITE completed and the
 * destination is told to drop its side.
 *
 * Wrong: qemu_rdma_init_control() leaks the control MR of the slot whose
 * receive post failed (the unwind stops below it); qemu_rdma_src_reg_chunk()
 * loses a fresh chunk registration when the chunk table cannot be allocated.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sa_qmig.h"

#define error_report(fmt, ...) fprintf(stderr, "rdma: " fmt "\n", ##__VA_ARGS__)

enum { RDMA_WRID_SEND_CONTROL, RDMA_WRID_RECV_CONTROL, RDMA_WRID_READY };

static RDMACapabilities qemu_rdma_dest_caps;

static int qemu_rdma_post_recv_control(RDMAContext *rdma, int idx)
{
	struct ibv_recv_wr *bad_wr;
	struct ibv_sge sge = {
		.addr = (uintptr_t)rdma->wr_data[idx].control,
		.length = RDMA_CONTROL_MAX_BUFFER,
		.lkey = rdma->wr_data[idx].control_mr->lkey,
	};
	struct ibv_recv_wr recv_wr = {
		.wr_id = (uint64_t)idx, .sg_list = &sge, .num_sge = 1,
	};

	return ibv_post_recv(rdma->qp, &recv_wr, &bad_wr) ? -1 : 0;
}

int qemu_rdma_init_control(RDMAContext *rdma)
{
	int idx, j;

	for (idx = 0; idx < RDMA_WRID_MAX; idx++) {
		RDMAWorkRequestData *wr = &rdma->wr_data[idx];

		wr->control = malloc(RDMA_CONTROL_MAX_BUFFER);
		if (!wr->control)
			goto err;
		wr->control_mr = ibv_reg_mr(rdma->pd, wr->control,
					    RDMA_CONTROL_MAX_BUFFER,
					    IBV_ACCESS_LOCAL_WRITE);
		if (!wr->control_mr) {
			free(wr->control);
			goto err;
		}
		if (idx != RDMA_WRID_SEND_CONTROL &&
		    qemu_rdma_post_recv_control(rdma, idx)) {
			error_report("cannot post control recv %d", idx);
			goto err;	/* BUG: rdma-mr-leak -- wr_data[idx].control_mr is registered; the unwind below only covers 0..idx-1 */
		}
	}
	return 0;

err:
	for (j = 0; j < idx; j++) {
		ibv_dereg_mr(rdma->wr_data[j].control_mr);
		rdma->wr_data[j].control_mr = NULL;
		free(rdma->wr_data[j].control);
	}
	return -1;
}

void qemu_rdma_free_control(RDMAContext *rdma)
{
	int idx;

	for (idx = 0; idx < RDMA_WRID_MAX; idx++) {
		if (!rdma->wr_data[idx].control_mr)
			continue;
		ibv_dereg_mr(rdma->wr_data[idx].control_mr);
		rdma->wr_data[idx].control_mr = NULL;	/* OK: rdma-mr-leak -- deregistered just above */
		free(rdma->wr_data[idx].control);
	}
}

int qemu_rdma_poll_wrid(RDMAContext *rdma, uint64_t wrid)
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
			error_report("wrid %llu: %s", (unsigned long long)wc.wr_id,
				     ibv_wc_status_str(wc.status));
			rdma->error_state = -EIO;
			return -1;
		}
		if (wc.wr_id == wrid)
			return 0;
	}
}

int qemu_rdma_post_send_control(RDMAContext *rdma, const void *payload,
				RDMAControlHeader *head)
{
	RDMAWorkRequestData *wr = &rdma->wr_data[RDMA_WRID_SEND_CONTROL];
	struct ibv_send_wr *bad_wr;
	struct ibv_sge sge = {
		.addr = (uintptr_t)wr->control,
		.length = head->len + sizeof(*head),
		.lkey = wr->control_mr->lkey,
	};
	struct ibv_send_wr send_wr = {
		.wr_id = RDMA_WRID_SEND_CONTROL, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED, .sg_list = &sge, .num_sge = 1,
	};

	memcpy(wr->control, head, sizeof(*head));
	if (payload)
		memcpy(wr->control + sizeof(*head), payload, head->len);
	if (ibv_post_send(rdma->qp, &send_wr, &bad_wr))
		return -1;
	return qemu_rdma_poll_wrid(rdma, RDMA_WRID_SEND_CONTROL);
}

int qemu_rdma_wait_control(RDMAContext *rdma, uint32_t type,
			   void **payload, uint32_t *len)
{
	RDMAWorkRequestData *wr = &rdma->wr_data[RDMA_WRID_RECV_CONTROL];
	RDMAControlHeader head;

	if (qemu_rdma_poll_wrid(rdma, RDMA_WRID_RECV_CONTROL))
		return -1;
	memcpy(&head, wr->control, sizeof(head));
	if (type != RDMA_CONTROL_NONE && head.type != type) {
		error_report("expected control %u, got %u", type, head.type);
		return -1;
	}
	if (payload)
		*payload = wr->control + sizeof(head);
	if (len)
		*len = head.len;
	return qemu_rdma_post_recv_control(rdma, RDMA_WRID_RECV_CONTROL) ? -1 : (int)head.type;
}

/* ---------------------------------------------------------------- source */

static int qemu_rdma_src_reg_chunk(RDMAContext *rdma, RDMALocalBlock *block,
				   int chunk, uint32_t *lkey)
{
	uint8_t *start = ram_chunk_start(block, chunk);
	uint8_t *end = ram_chunk_end(block, chunk);
	struct ibv_mr *mr;

	if (rdma->pin_all) {
		*lkey = block->mr->lkey;
		return 0;
	}
	if (block->pmr && block->pmr[chunk]) {
		*lkey = block->pmr[chunk]->lkey;
		return 0;
	}

	mr = ibv_reg_mr(rdma->pd, start, end - start, 0);
	if (!mr && errno == EOPNOTSUPP)
		mr = ibv_reg_mr(rdma->pd, start, end - start, IBV_ACCESS_ON_DEMAND);
	if (!mr) {
		error_report("cannot register chunk %d of %s", chunk, block->block_name);
		return -1;
	}
	if (!block->pmr) {
		block->pmr = calloc(block->nb_chunks, sizeof(*block->pmr));
		if (!block->pmr)
			return -1;	/* BUG: rdma-mr-leak -- the chunk registration in 'mr' is dropped */
	}
	block->pmr[chunk] = mr;
	*lkey = mr->lkey;
	return 0;
}

static int qemu_rdma_src_remote_key(RDMAContext *rdma, RDMALocalBlock *block,
				    int chunk, uint32_t *rkey)
{
	RDMARegister reg = {
		.current_addr = block->offset + ((uint64_t)chunk << RDMA_REG_CHUNK_SHIFT),
		.current_index = (uint32_t)block->index,
		.chunks = 1,
	};
	RDMAControlHeader head = {
		.len = sizeof(reg), .type = RDMA_CONTROL_REGISTER_REQUEST, .repeat = 1,
	};
	RDMARegisterResult *res;

	if (rdma->pin_all) {
		*rkey = block->remote_rkey;
		return 0;
	}
	if (block->remote_keys[chunk]) {
		*rkey = block->remote_keys[chunk];
		return 0;
	}
	if (qemu_rdma_post_send_control(rdma, &reg, &head) ||
	    qemu_rdma_wait_control(rdma, RDMA_CONTROL_REGISTER_RESULT,
				   (void **)&res, NULL) < 0)
		return -1;
	block->remote_keys[chunk] = res->rkey;
	*rkey = res->rkey;
	return 0;
}

int qemu_rdma_write_one(RDMAContext *rdma, int block_index, int chunk)
{
	RDMALocalBlock *block = &rdma->local_ram_blocks.block[block_index];
	uint8_t *start = ram_chunk_start(block, chunk);
	struct ibv_send_wr *bad_wr;
	struct ibv_sge sge;
	struct ibv_send_wr wr;
	uint32_t rkey;

	if (qemu_rdma_src_reg_chunk(rdma, block, chunk, &sge.lkey) ||
	    qemu_rdma_src_remote_key(rdma, block, chunk, &rkey))
		return -1;

	sge.addr = (uintptr_t)start;
	sge.length = (uint32_t)(ram_chunk_end(block, chunk) - start);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = RDMA_WRID_RDMA_WRITE;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = block->remote_host_addr +
				 (uint64_t)(start - block->local_host_addr);
	if (ibv_post_send(rdma->qp, &wr, &bad_wr) ||
	    qemu_rdma_poll_wrid(rdma, RDMA_WRID_RDMA_WRITE))
		return -1;

	if (!rdma->pin_all) {
		rdma->unreg[rdma->unreg_head] = RDMA_UNREG_ENCODE(block_index, chunk);
		rdma->unreg_head = (rdma->unreg_head + 1) % RDMA_UNREG_QUEUE;
	}
	return 0;
}

int qemu_rdma_unregister_waiting(RDMAContext *rdma)
{
	while (rdma->unreg_tail != rdma->unreg_head) {
		uint64_t v = rdma->unreg[rdma->unreg_tail];
		RDMALocalBlock *block = &rdma->local_ram_blocks.block[RDMA_UNREG_BLOCK(v)];
		int chunk = RDMA_UNREG_CHUNK(v);
		RDMARegister reg = {
			.current_addr = (uint64_t)chunk,
			.current_index = (uint32_t)block->index,
			.chunks = 1,
		};
		RDMAControlHeader head = {
			.len = sizeof(reg), .type = RDMA_CONTROL_UNREGISTER_REQUEST, .repeat = 1,
		};

		rdma->unreg_tail = (rdma->unreg_tail + 1) % RDMA_UNREG_QUEUE;
		if (ibv_dereg_mr(block->pmr[chunk])) {
			error_report("unregistration of chunk %d failed", chunk);
			return -1;
		}
		block->pmr[chunk] = NULL;	/* OK: rdma-mr-leak -- deregistered just above */
		block->remote_keys[chunk] = 0;
		if (qemu_rdma_post_send_control(rdma, &reg, &head) ||
		    qemu_rdma_wait_control(rdma, RDMA_CONTROL_UNREGISTER_FINISHED,
					   NULL, NULL) < 0)
			return -1;
	}
	return 0;
}

int qemu_rdma_source_connect(RDMAContext *rdma, struct rdma_conn_param *cp)
{
	struct rdma_cm_event *ev;
	int ret;

	if (rdma_connect(rdma->cm_id, cp) || rdma_get_cm_event(rdma->channel, &ev))
		return -1;
	ret = ev->event == RDMA_CM_EVENT_ESTABLISHED ? 0 : -1;
	if (!ret && ev->param.conn.private_data_len >= sizeof(qemu_rdma_dest_caps))
		memcpy(&qemu_rdma_dest_caps, ev->param.conn.private_data,
		       sizeof(qemu_rdma_dest_caps));
	rdma_ack_cm_event(ev);
	if (ret)
		return ret;

	rdma->stage_buf = malloc(RDMA_BITMAP_MAX);
	if (!rdma->stage_buf)
		return -1;
	rdma->stage_mr = ibv_reg_mr(rdma->pd, rdma->stage_buf, RDMA_BITMAP_MAX,
				    IBV_ACCESS_LOCAL_WRITE);
	if (!rdma->stage_mr) {
		free(rdma->stage_buf);
		rdma->stage_buf = NULL;
		return -1;
	}
	return 0;
}

void qemu_rdma_src_cleanup(RDMAContext *rdma)
{
	RDMALocalBlocks *local = &rdma->local_ram_blocks;
	int i, j;

	for (i = 0; i < local->nb_blocks; i++) {
		RDMALocalBlock *block = &local->block[i];

		if (block->pmr) {
			for (j = 0; j < block->nb_chunks; j++)
				if (block->pmr[j])
					ibv_dereg_mr(block->pmr[j]);
			free(block->pmr);	/* OK: rdma-mr-leak -- every chunk MR in the table is deregistered first */
			block->pmr = NULL;
		}
		if (block->mr) {
			ibv_dereg_mr(block->mr);
			block->mr = NULL;
		}
	}
	if (rdma->stage_mr) {
		free(rdma->stage_buf);	/* OK: rdma-invalidation-leak -- stage_mr is local-only; no key was handed out */
		ibv_dereg_mr(rdma->stage_mr);
		rdma->stage_mr = NULL;
	}
	qemu_rdma_free_control(rdma);
}
