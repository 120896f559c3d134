/*
 * fragx: hands fragmented log segments of a log-structured store to a
 * remote compactor (mlx5 only, mlx5dv).  A segment is a list of extents
 * scattered over the data arena; to let the compactor RDMA-READ it as one
 * contiguous buffer, the store configures one of its indirect mkeys over
 * the extents with mlx5dv_wr_mr_list() and sends (mkey, len) in the same
 * batch.  When the compactor answers DONE (or the application cancels the
 * export), the mkey is invalidated and the segment's extents go back to
 * the arena's extent allocator.
 *
 * Correct: the send queue and inline size are clamped to / read back from
 * what the device grants; cancel posts a signaled LOCAL_INV and polls for
 * it before the extents are recycled.
 *
 * Not correct: the DONE path posts an unsignaled LOCAL_INV and recycles the
 * extents right away; new log records are written into them while the
 * compactor's key may still read them.
 */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FRAGX_SLOTS	32
#define FRAGX_MAX_EXT	16
#define FRAGX_SQ_DEPTH	2048
#define FRAGX_KLM_BYTES	16

struct fragx_export_msg {
	uint32_t slot;
	uint32_t mkey;
	uint64_t len;
};

struct fragx_slot {
	struct mlx5dv_mkey      *mkey;
	struct ibv_sge           sge[FRAGX_MAX_EXT];
	uint32_t                 ext[FRAGX_MAX_EXT];
	uint16_t                 n;
	bool                     busy;
	struct fragx_export_msg  msg;
};

struct fragx {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	struct mlx5dv_qp_ex *mqpx;
	struct ibv_mr       *arena_mr;	/* LOCAL_WRITE: the mkeys carry the remote rights */
	struct ibv_mr       *msg_mr;	/* covers slots[] */
	char                *arena;
	size_t               ext_size;
	uint32_t            *ext_free;
	unsigned int         nfree;
	struct fragx_slot    slots[FRAGX_SLOTS];
};

int fragx_create_qp(struct fragx *fx)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr_ex attr;
	struct mlx5dv_qp_init_attr mattr;

	if (ibv_query_device(fx->ctx, &da))
		return -EIO;
	memset(&attr, 0, sizeof(attr));
	memset(&mattr, 0, sizeof(mattr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = fx->cq;
	attr.recv_cq = fx->cq;
	attr.pd = fx->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-queue-cap-unchecked -- the wanted depth is clamped to max_qp_wr */
	attr.cap.max_send_wr = FRAGX_SQ_DEPTH < da.max_qp_wr ? FRAGX_SQ_DEPTH : da.max_qp_wr;
	attr.cap.max_recv_wr = FRAGX_SLOTS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = FRAGX_MAX_EXT * FRAGX_KLM_BYTES;
	mattr.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	mattr.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;

	fx->qp = mlx5dv_create_qp(fx->ctx, &attr, &mattr);
	if (!fx->qp)
		return -errno;
	/* OK: rdma-queue-cap-unchecked -- the granted inline size is checked after creation */
	if (attr.cap.max_inline_data < FRAGX_MAX_EXT * FRAGX_KLM_BYTES) {
		ibv_destroy_qp(fx->qp);
		fx->qp = NULL;
		return -ENOTSUP;
	}
	fx->qpx = ibv_qp_to_qp_ex(fx->qp);
	fx->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(fx->qpx);
	return 0;
}

int fragx_create_mkeys(struct fragx *fx)
{
	struct mlx5dv_mkey_init_attr ka = {
		.pd = fx->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = FRAGX_MAX_EXT,
	};
	int i, j;

	for (i = 0; i < FRAGX_SLOTS; i++) {
		fx->slots[i].mkey = mlx5dv_create_mkey(&ka); // BUG: rdma-local-mr-management -- indirect mkeys managed by the ULP
		if (!fx->slots[i].mkey) {
			for (j = 0; j < i; j++)
				mlx5dv_destroy_mkey(fx->slots[j].mkey);
			return -ENOMEM;
		}
	}
	return 0;
}

static void fragx_ext_put(struct fragx *fx, struct fragx_slot *s)
{
	uint16_t k;

	for (k = 0; k < s->n; k++)
		fx->ext_free[fx->nfree++] = s->ext[k];
	s->n = 0;
	s->busy = false;
}

int fragx_export(struct fragx *fx, const uint32_t *ext, uint16_t n, uint64_t len)
{
	struct fragx_slot *s = NULL;
	unsigned int i;
	uint16_t k;

	if (n > FRAGX_MAX_EXT)
		return -EINVAL;
	for (i = 0; i < FRAGX_SLOTS; i++)
		if (!fx->slots[i].busy) {
			s = &fx->slots[i];
			break;
		}
	if (!s)
		return -EAGAIN;

	for (k = 0; k < n; k++) {
		s->ext[k] = ext[k];
		s->sge[k].addr = (uintptr_t)(fx->arena + (size_t)ext[k] * fx->ext_size);
		s->sge[k].length = (uint32_t)fx->ext_size;
		s->sge[k].lkey = fx->arena_mr->lkey;
	}
	s->n = n;
	s->busy = true;
	s->msg.slot = htobe32(i);
	s->msg.mkey = htobe32(s->mkey->rkey);
	s->msg.len = htobe64(len);

	ibv_wr_start(fx->qpx);
	fx->qpx->wr_id = i;
	fx->qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(fx->mqpx, s->mkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, n, s->sge); // BUG: rdma-local-mr-management -- per-export UMR configured by the ULP
	fx->qpx->wr_id = i;
	fx->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(fx->qpx);
	ibv_wr_set_sge(fx->qpx, fx->msg_mr->lkey, (uintptr_t)&s->msg, sizeof(s->msg));
	if (ibv_wr_complete(fx->qpx)) {
		s->n = 0;
		s->busy = false;
		return -EIO;
	}
	return 0;
}

/* the compactor is done with the segment in slot i */
void fragx_done(struct fragx *fx, unsigned int i)
{
	struct fragx_slot *s = &fx->slots[i];

	ibv_wr_start(fx->qpx);
	fx->qpx->wr_id = i;
	fx->qpx->wr_flags = 0;
	ibv_wr_local_inv(fx->qpx, s->mkey->rkey);
	if (ibv_wr_complete(fx->qpx))
		return;		/* keep the extents until the connection is reset */
	fragx_ext_put(fx, s); // BUG: rdma-unmap-before-invalidate -- extents recycled right after an unsignaled LOCAL_INV of the mkey
}

static int fragx_wait(struct fragx *fx, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(fx->cq, 1, &wc);
		if (n < 0)
			return -EIO;
	} while (n == 0 || wc.wr_id != wr_id);
	return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
}

/* the application deleted the segment before the compactor got to it */
int fragx_cancel(struct fragx *fx, unsigned int i)
{
	struct fragx_slot *s = &fx->slots[i];
	uint64_t id = (1ULL << 32) | i;

	ibv_wr_start(fx->qpx);
	fx->qpx->wr_id = id;
	fx->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(fx->qpx, s->mkey->rkey);
	if (ibv_wr_complete(fx->qpx) || fragx_wait(fx, id))
		return -EIO;
	fragx_ext_put(fx, s); // OK: rdma-unmap-before-invalidate -- the signaled LOCAL_INV was polled for
	return 0;
}
