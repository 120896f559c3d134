/*
 * sgli: a scatter-gather block initiator for ConnectX adapters (mlx5dv
 * only).  I/O buffers are lists of 4 KiB pages from a pool registered
 * once; for each I/O an indirect mkey is configured over the page list
 * with mlx5dv_wr_mr_list() (a UMR work request) and its rkey is sent in
 * the command, so the target sees one contiguous buffer.  After the
 * response the mkey is invalidated with a signaled LOCAL_INV and the I/O
 * slot is recycled from that completion.
 *
 * Correct: invalidation before reuse, waited for; windows of the pool MR
 * are never exposed directly; mlx5-only code never meets iWARP.
 * Not correct: the UMR grants remote write without local write, which the
 * device rejects (the UMR completes in error); the queue is sized with a
 * hand-made factor for UMR and LOCAL_INV (migration note).
 */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SGLI_MAX_PAGES	32
#define SGLI_SQ_WRS(d)	(3 * (d) + 1)	/* UMR, SEND, LOCAL_INV per I/O */

struct sgli_cmd {
	uint32_t tag;
	uint32_t op;
	uint64_t lba;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct sgli_io {
	struct sgli_io     *next_free;
	uint32_t            tag;
	struct mlx5dv_mkey *mkey;
	struct ibv_sge      pages[SGLI_MAX_PAGES];
	uint16_t            npages;
	struct sgli_cmd     cmd;
	void              (*done)(struct sgli_io *, int);
	int                 status;
};

struct sgli_queue {
	struct ibv_context   *ctx;
	struct ibv_pd        *pd;
	struct ibv_cq        *cq;
	struct ibv_qp        *qp;
	struct ibv_qp_ex     *qpx;
	struct mlx5dv_qp_ex  *mqpx;
	struct ibv_mr        *cmd_mr;
	unsigned int          depth;
	struct sgli_io       *ios;
	struct sgli_io       *free_ios;
};

enum { SGLI_WR_UMR = 1, SGLI_WR_SEND, SGLI_WR_INV };
#define SGLI_WRID(io, kind)	(((uint64_t)(io)->tag << 8) | (kind))

int sgli_create_qp(struct sgli_queue *q)
{
	struct ibv_qp_init_attr_ex attr;
	struct mlx5dv_qp_init_attr dv;

	memset(&attr, 0, sizeof(attr));
	memset(&dv, 0, sizeof(dv));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.pd = q->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-undersized -- UMR + SEND + LOCAL_INV per I/O, plus one */
	attr.cap.max_send_wr = SGLI_SQ_WRS(q->depth); // BUG: rdma-send-queue-manual-factor -- depth times a hand-made factor for UMR/LOCAL_INV
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 64;	/* OK: rdma-queue-cap-unchecked -- 64 bytes is within every device's limit */
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;

	q->qp = mlx5dv_create_qp(q->ctx, &attr, &dv);
	if (!q->qp)
		return -errno;
	q->qpx = ibv_qp_to_qp_ex(q->qp);
	q->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(q->qpx);
	return 0;
}

int sgli_alloc_ios(struct sgli_queue *q)
{
	struct mlx5dv_mkey_init_attr mattr = {
		.pd = q->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = SGLI_MAX_PAGES,
	};
	unsigned int i;

	q->ios = calloc(q->depth, sizeof(*q->ios));
	if (!q->ios)
		return -ENOMEM;
	for (i = 0; i < q->depth; i++) {
		q->ios[i].tag = i;
		q->ios[i].mkey = mlx5dv_create_mkey(&mattr); // BUG: rdma-local-mr-management -- the ULP creates its own mkeys to expose memory
		if (!q->ios[i].mkey)
			goto undo;
		q->ios[i].next_free = q->free_ios;
		q->free_ios = &q->ios[i];
	}
	return 0;
undo:
	while (i--)
		mlx5dv_destroy_mkey(q->ios[i].mkey);
	free(q->ios);
	q->ios = NULL;
	return -ENOMEM;
}

int sgli_submit(struct sgli_queue *q, struct sgli_io *io, int write, uint64_t lba,
		uint32_t len)
{
	uint32_t access = IBV_ACCESS_REMOTE_READ;

	if (!write)		/* target writes the data read from disk */
		access |= IBV_ACCESS_REMOTE_WRITE;

	io->cmd.tag = htobe32(io->tag);
	io->cmd.op = htobe32(write);
	io->cmd.lba = htobe64(lba);
	io->cmd.addr = 0;	/* zero-based indirect mkey */
	io->cmd.rkey = htobe32(io->mkey->rkey);
	io->cmd.len = htobe32(len);

	ibv_wr_start(q->qpx);
	q->qpx->wr_id = SGLI_WRID(io, SGLI_WR_UMR);
	q->qpx->wr_flags = IBV_SEND_INLINE;
	// BUG: rdma-access-flags-invalid -- remote write requested without IBV_ACCESS_LOCAL_WRITE on the read path
	mlx5dv_wr_mr_list(q->mqpx, io->mkey, access, io->npages, io->pages); // BUG: rdma-local-mr-management -- per-I/O mkey registration done by the ULP

	q->qpx->wr_id = SGLI_WRID(io, SGLI_WR_SEND);
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(q->qpx);
	ibv_wr_set_sge(q->qpx, q->cmd_mr->lkey, (uintptr_t)&io->cmd, sizeof(io->cmd));
	return ibv_wr_complete(q->qpx);
}

static int sgli_invalidate(struct sgli_queue *q, struct sgli_io *io)
{
	ibv_wr_start(q->qpx);
	q->qpx->wr_id = SGLI_WRID(io, SGLI_WR_INV);
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(q->qpx, io->mkey->rkey);
	return ibv_wr_complete(q->qpx);
}

struct sgli_rsp {
	uint32_t tag;
	int32_t  status;
};

void sgli_handle_wc(struct sgli_queue *q, const struct ibv_wc *wc,
		    const struct sgli_rsp *rsp)
{
	struct sgli_io *io;

	if (wc->opcode == IBV_WC_RECV) {
		io = &q->ios[be32toh(rsp->tag) % q->depth];
		io->status = (int32_t)be32toh((uint32_t)rsp->status);
		if (sgli_invalidate(q, io))
			io->status = -EIO;	/* slot stays out of the free list */
		return;
	}
	if ((wc->wr_id & 0xff) != SGLI_WR_INV)
		return;
	io = &q->ios[(wc->wr_id >> 8) % q->depth];
	if (wc->status != IBV_WC_SUCCESS) {
		/* flushed: the mkey may still be valid, keep the slot out until teardown */
		io->done(io, -EIO);
		return;
	}
	io->done(io, io->status);
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- recycled from the LOCAL_INV completion */
	io->next_free = q->free_ios;
	q->free_ios = io;
}

void sgli_destroy(struct sgli_queue *q)
{
	unsigned int i;

	ibv_destroy_qp(q->qp);
	for (i = 0; i < q->depth; i++)
		mlx5dv_destroy_mkey(q->ios[i].mkey);
	free(q->ios);
}
