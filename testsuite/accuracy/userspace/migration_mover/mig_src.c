/*
 * mig_src.c: source side.  Dirty chunks are written with the extended QP
 * API; the chunk being written from is registered on first use (lkey
 * only, access 0) and kept.  Every MIG_SIG_EVERY-th WRITE is signaled,
 * with a counter advanced on each post, and outstanding WRITEs are bounded
 * by the queue depth.
 *
 * Not correct: the send queue is created with MIG_SRC_SQ = 4096 entries,
 * a value tuned on one adapter and never compared with max_qp_wr.
 */
#include "mig.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MIG_SRC_SQ	4096
#define MIG_SIG_EVERY	64

int mig_src_create_qp(struct mig_ctx *m)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = m->cq;
	attr.recv_cq = m->cq;
	attr.pd = m->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;
	attr.cap.max_send_wr = MIG_SRC_SQ; // BUG: rdma-queue-cap-unchecked -- 4096 send WRs without comparing with max_qp_wr
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	m->qp = ibv_create_qp_ex(m->ctx, &attr);
	if (!m->qp)
		return -errno;
	m->qpx = ibv_qp_to_qp_ex(m->qp);
	return 0;
}

static struct ibv_mr *mig_src_chunk_mr(struct mig_ctx *m, struct mig_block *b, unsigned int c)
{
	if (!b->chunk_mr[c]) {
		uint64_t off = (uint64_t)c << MIG_CHUNK_SHIFT;
		uint64_t len = b->len - off < MIG_CHUNK ? b->len - off : MIG_CHUNK;

		/* OK: rdma-registration-in-datapath -- registered on first use and kept in chunk_mr[] */
		b->chunk_mr[c] = ibv_reg_mr(m->pd, b->host + off, len, 0); // BUG: rdma-local-mr-management -- lkey is the source of the mover's own RDMA WRITEs
	}
	return b->chunk_mr[c];
}

int mig_src_write(struct mig_ctx *m, int blk, uint64_t off, uint32_t len)
{
	struct mig_block *b = &m->blocks[blk];
	unsigned int c = off >> MIG_CHUNK_SHIFT;
	struct ibv_mr *mr = mig_src_chunk_mr(m, b, c);
	struct ibv_wc wc[16];

	if (!mr)
		return -errno;
	while (m->outstanding >= MIG_SRC_SQ - MIG_SIG_EVERY) {
		int n = ibv_poll_cq(m->cq, 16, wc), i;

		if (n < 0)
			return -EIO;
		for (i = 0; i < n; i++)
			m->outstanding -= MIG_SIG_EVERY;
	}
	ibv_wr_start(m->qpx);
	m->qpx->wr_id = off;
	m->qpx->wr_flags = 0;
	/* OK: rdma-unsignaled-send-starvation -- since_signal advances on every WRITE */
	if (++m->since_signal == MIG_SIG_EVERY) {
		m->qpx->wr_flags = IBV_SEND_SIGNALED;
		m->since_signal = 0;
	}
	ibv_wr_rdma_write(m->qpx, b->remote_rkey[c], b->remote_host + off);
	ibv_wr_set_sge(m->qpx, mr->lkey, (uintptr_t)(b->host + off), len);
	if (ibv_wr_complete(m->qpx))
		return -EIO;
	m->outstanding++;
	return 0;
}
