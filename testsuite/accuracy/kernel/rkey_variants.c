// SPDX-License-Identifier: GPL-2.0
/*
 * wal: write-ahead-log export of an invented replicated database ("wal").
 * Each log segment is exposed to replicas with an MR from a list allocated
 * at startup (ib_alloc_mr), registered per segment and invalidated when all
 * replicas have pulled it.
 *
 *   - wal_expose_segment() never changes the key: every segment exposed
 *     through a given MR has the same rkey (bug);
 *   - wal_expose_tail() captures the key into the work request and the
 *     descriptor, then rotates: the REG_MR still registers the old key
 *     (bug);
 *   - wal_expose_snapshot() rotates before building the work request (right).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>

struct wal_mr {
	struct list_head	entry;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
};

struct wal_log {
	struct ib_qp		*qp;
	struct list_head	free_mrs;
};

struct wal_seg {
	struct wal_log		*log;
	struct wal_mr		*wmr;
	struct scatterlist	*sgl;
	int			nents;
	u8			desc[12];
};

static int wal_map(struct wal_seg *s)
{
	struct wal_mr *wmr = s->wmr;

	/* BUG: rdma-local-mr-management -- the exporter maps the segment into its MR */
	if (ib_map_mr_sg(wmr->mr, s->sgl, s->nents, NULL, SZ_4K) != s->nents)
		return -EINVAL;
	memset(&wmr->reg_wr, 0, sizeof(wmr->reg_wr));
	wmr->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the exporter */
	wmr->reg_wr.access = IB_ACCESS_REMOTE_READ;
	return 0;
}

static void wal_advertise(struct wal_seg *s, u32 rkey)
{
	put_unaligned_le64(s->wmr->mr->iova, s->desc);
	put_unaligned_le32(rkey, s->desc + 8);
}

int wal_expose_segment(struct wal_seg *s)
{
	struct wal_mr *wmr = s->wmr;

	if (wal_map(s))
		return -EINVAL;
	wmr->reg_wr.mr = wmr->mr; /* BUG: rdma-rkey-reuse -- the MR comes back from invalidation and is registered again with the same rkey */
	wmr->reg_wr.key = wmr->mr->rkey;
	wal_advertise(s, wmr->mr->rkey);
	return ib_post_send(s->log->qp, &wmr->reg_wr.wr, NULL);
}

int wal_expose_tail(struct wal_seg *s)
{
	struct wal_mr *wmr = s->wmr;

	if (wal_map(s))
		return -EINVAL;
	wmr->reg_wr.mr = wmr->mr; /* BUG: rdma-rkey-reuse -- the key is captured below before it is rotated, so the REG_MR registers the old rkey again */
	wmr->reg_wr.key = wmr->mr->rkey;
	wal_advertise(s, wmr->mr->rkey);
	ib_update_fast_reg_key(wmr->mr, ib_inc_rkey(wmr->mr->rkey));
	return ib_post_send(s->log->qp, &wmr->reg_wr.wr, NULL);
}

static void wal_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("wal: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
}

int wal_expose_snapshot(struct wal_seg *s)
{
	struct wal_mr *wmr = s->wmr;

	if (wal_map(s))
		return -EINVAL;
	ib_update_fast_reg_key(wmr->mr, ib_inc_rkey(wmr->mr->rkey));
	wmr->reg_wr.mr = wmr->mr; /* OK: rdma-rkey-reuse -- rotated on the only path, before the key is captured */
	wmr->reg_wr.key = wmr->mr->rkey;
	wal_advertise(s, wmr->mr->rkey);
	return ib_post_send(s->log->qp, &wmr->reg_wr.wr, NULL);
}

int wal_segment_pulled(struct wal_seg *s)
{
	struct wal_mr *wmr = s->wmr;

	wmr->inv_wr.opcode = IB_WR_LOCAL_INV;
	wmr->inv_wr.next = NULL;
	wmr->inv_wr.num_sge = 0;
	wmr->inv_wr.send_flags = IB_SEND_SIGNALED;
	wmr->inv_wr.ex.invalidate_rkey = wmr->mr->rkey;
	wmr->inv_cqe.done = wal_inv_done;
	wmr->inv_wr.wr_cqe = &wmr->inv_cqe;
	return ib_post_send(s->log->qp, &wmr->inv_wr, NULL);
}
