/*
 * pivol: initiator of a volume protocol with protection information.
 * For each I/O the data blocks and their 8-byte PI tuples (separate pools)
 * are presented to the target as one interleaved buffer through an mlx5
 * indirect mkey configured with mlx5dv_wr_mr_interleaved().  The mkeys are
 * created with REMOTE_INVALIDATE, and the target normally answers with
 * SEND_WITH_INV; when it does not, the initiator posts LOCAL_INV.
 *
 * Completions are read with the extended CQ API.  The send queue takes the
 * device's maximum (no per-request arithmetic), and the in-flight I/O
 * count is far below it.
 *
 * Not correct: a response flagged IBV_WC_WITH_INV is taken as "this I/O's
 * mkey is dead" without comparing ibv_wc_read_invalidated_rkey() with the
 * I/O's key, so a target that invalidates some other key keeps this one
 * alive and the slot is reused with it.
 */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PIVOL_DEPTH	128
#define PIVOL_BLOCK	512
#define PIVOL_PI	8

struct pivol_rsp {
	uint32_t tag;
	int32_t  status;
};

struct pivol_io {
	struct pivol_io    *next_free;
	uint32_t            tag;
	struct mlx5dv_mkey *mkey;
	bool                key_live;
	uint64_t            data_addr, pi_addr;
	uint32_t            nblocks;
	int                 status;
	void              (*done)(struct pivol_io *, int);
};

struct pivol {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq_ex    *cqx;
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	struct mlx5dv_qp_ex *mqpx;
	struct ibv_mr       *data_mr, *pi_mr, *msg_mr;
	struct pivol_rsp    *rsps;
	struct pivol_io      ios[PIVOL_DEPTH];
	struct pivol_io     *free_ios;
};

int pivol_create_queues(struct pivol *v)
{
	struct ibv_device_attr dattr;
	struct ibv_cq_init_attr_ex cq_attr = {
		.cqe = 4 * PIVOL_DEPTH,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
	};
	struct ibv_qp_init_attr_ex attr;
	struct mlx5dv_qp_init_attr dv = {
		.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
		.send_ops_flags = MLX5DV_QP_EX_WITH_MR_INTERLEAVED,
	};

	if (ibv_query_device(v->ctx, &dattr))
		return -errno;
	v->cqx = ibv_create_cq_ex(v->ctx, &cq_attr);
	if (!v->cqx)
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = ibv_cq_ex_to_cq(v->cqx);
	attr.recv_cq = ibv_cq_ex_to_cq(v->cqx);
	attr.pd = v->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- the device maximum, far above 3 WRs x PIVOL_DEPTH */
	attr.cap.max_send_wr = dattr.max_qp_wr;
	attr.cap.max_recv_wr = PIVOL_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	v->qp = mlx5dv_create_qp(v->ctx, &attr, &dv);
	if (!v->qp) {
		ibv_destroy_cq(ibv_cq_ex_to_cq(v->cqx));
		return -errno;
	}
	v->qpx = ibv_qp_to_qp_ex(v->qp);
	v->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(v->qpx);
	return 0;
}

int pivol_create_mkeys(struct pivol *v)
{
	struct mlx5dv_mkey_init_attr mattr = {
		.pd = v->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
				MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE,
		.max_entries = 2,
	};
	int i;

	for (i = 0; i < PIVOL_DEPTH; i++) {
		v->ios[i].tag = i;
		v->ios[i].mkey = mlx5dv_create_mkey(&mattr); // BUG: rdma-local-mr-management -- mkeys created by the ULP to expose memory
		if (!v->ios[i].mkey)
			break;
		v->ios[i].next_free = v->free_ios;
		v->free_ios = &v->ios[i];
	}
	if (i == PIVOL_DEPTH)
		return 0;
	while (--i >= 0)
		mlx5dv_destroy_mkey(v->ios[i].mkey);
	v->free_ios = NULL;
	return -ENOMEM;
}

int pivol_map_io(struct pivol *v, struct pivol_io *io, int to_target)
{
	struct mlx5dv_mr_interleaved layout[2] = {
		{ .addr = io->data_addr, .bytes_count = PIVOL_BLOCK, .bytes_skip = 0,
		  .lkey = v->data_mr->lkey },
		{ .addr = io->pi_addr, .bytes_count = PIVOL_PI, .bytes_skip = 0,
		  .lkey = v->pi_mr->lkey },
	};
	uint32_t access = IBV_ACCESS_LOCAL_WRITE |
			  (to_target ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE);

	ibv_wr_start(v->qpx);
	v->qpx->wr_id = io->tag;
	v->qpx->wr_flags = IBV_SEND_INLINE;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE is set on both paths */
	mlx5dv_wr_mr_interleaved(v->mqpx, io->mkey, access, io->nblocks, 2, layout); // BUG: rdma-local-mr-management -- per-I/O mkey configuration done by the ULP
	io->key_live = true;
	return ibv_wr_complete(v->qpx);
}

static int pivol_local_inv(struct pivol *v, struct pivol_io *io)
{
	ibv_wr_start(v->qpx);
	v->qpx->wr_id = (1ull << 32) | io->tag;
	v->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(v->qpx, io->mkey->rkey);
	return ibv_wr_complete(v->qpx);
}

static void pivol_recycle(struct pivol *v, struct pivol_io *io)
{
	io->done(io, io->status);
	io->next_free = v->free_ios;
	v->free_ios = io;
}

void pivol_poll(struct pivol *v)
{
	struct ibv_poll_cq_attr pattr = { 0 };
	struct pivol_io *io;
	int ret;

	ret = ibv_start_poll(v->cqx, &pattr);
	if (ret)
		return;
	do {
		uint64_t wr_id = v->cqx->wr_id;

		if (v->cqx->status != IBV_WC_SUCCESS)
			continue;
		if (ibv_wc_read_opcode(v->cqx) == IBV_WC_LOCAL_INV) {
			io = &v->ios[(uint32_t)wr_id % PIVOL_DEPTH];
			io->key_live = false;
			pivol_recycle(v, io);
		} else if (ibv_wc_read_opcode(v->cqx) == IBV_WC_RECV) {
			struct pivol_rsp *rsp = &v->rsps[wr_id % PIVOL_DEPTH];

			io = &v->ios[be32toh(rsp->tag) % PIVOL_DEPTH];
			io->status = (int32_t)be32toh((uint32_t)rsp->status);
			// BUG: rdma-remote-invalidate-unchecked -- WITH_INV accepted without comparing ibv_wc_read_invalidated_rkey() with io->mkey->rkey
			if (ibv_wc_read_wc_flags(v->cqx) & IBV_WC_WITH_INV) {
				io->key_live = false;
				pivol_recycle(v, io);
			} else if (pivol_local_inv(v, io)) {
				io->status = -EIO;
			}
		}
	} while (ibv_next_poll(v->cqx) == 0);
	ibv_end_poll(v->cqx);
}
