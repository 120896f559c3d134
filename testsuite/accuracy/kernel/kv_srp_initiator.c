// SPDX-License-Identifier: GPL-2.0
/*
 * kv_srp_initiator.c - SCSI RDMA Protocol initiator, memory registration
 * (SRP style).
 *
 * Every RDMA channel has a fast-registration pool: an array of descriptors,
 * each owning one MR, handed out from a free list under a spinlock.  A
 * command maps its scatterlist into one or more descriptors (key rotated on
 * every use), writes the resulting rkeys into the SRP_CMD's direct or
 * indirect buffer descriptors, and, for an indirect table, registers the
 * table itself for remote read.  When the response arrives the initiator
 * queues one LOCAL_INV per descriptor and returns the descriptors to the
 * pool.  The target never uses SEND_WITH_INV.
 *
 * Known problems kept in this file:
 *  - the pool constructor's unwinding loop stops before index 0;
 *  - the indirect-table registration reuses the descriptor's old key;
 *  - srp_unmap_data() does not wait for its unsignaled LOCAL_INVs, and
 *    hands back descriptors whose LOCAL_INV could not even be posted.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-unsignaled-send-starvation -- not the subject of this module; the FR pool is manual MR management by design
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define SRP_MAX_PAGES_PER_MR	512
#define SRP_DATA_DESC_DIRECT	1
#define SRP_DATA_DESC_INDIRECT	2

struct srp_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct srp_indirect_buf {
	struct srp_direct_buf	table_desc;
	__be32			len;
	struct srp_direct_buf	desc_list[];
} __attribute__((packed));

struct srp_cmd {
	u8	opcode;
	u8	sol_not;
	u8	reserved1[3];
	u8	buf_fmt;
	u8	data_out_desc_cnt;
	u8	data_in_desc_cnt;
	u64	tag;
	u8	add_data[];
};

struct srp_fr_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
};

struct srp_fr_pool {
	int			size;
	int			max_page_list_len;
	spinlock_t		lock;
	struct list_head	free_list;
	struct srp_fr_desc	desc[];
};

struct srp_target_port {
	unsigned int		mr_per_cmd;
	unsigned int		mr_pool_size;
	unsigned int		max_pages_per_mr;
	struct work_struct	tl_err_work;
};

struct srp_request {
	struct list_head	list;
	struct srp_cmd		*cmd;
	struct srp_fr_desc	**fr_list;
	struct srp_direct_buf	*indirect_desc;
	u64			indirect_dma_addr;
	short			nmdesc;
	struct ib_cqe		reg_cqe;
	struct scatterlist	*sg;
	int			nents;
	enum dma_data_direction	dir;
};

struct srp_rdma_ch {
	struct srp_target_port	*target;
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct srp_fr_pool	*fr_pool;
	spinlock_t		lock;
	struct list_head	free_reqs;
};

struct srp_map_state {
	struct srp_fr_desc	**next;
	struct srp_fr_desc	**end;
	struct srp_direct_buf	*desc;
	struct scatterlist	*sg;
	unsigned int		ndesc;
	unsigned int		nmdesc;
	u32			total_len;
};

/* ---------------- fast registration pool ---------------- */

static void srp_destroy_fr_pool(struct srp_fr_pool *pool)
{
	int i;
	struct srp_fr_desc *d;

	if (!pool)
		return;

	for (i = 0, d = &pool->desc[0]; i < pool->size; i++, d++) {
		if (d->mr)
			ib_dereg_mr(d->mr);	/* OK: rdma-invalidation-leak -- deregistration kills whatever key the descriptor still had */
	}
	kfree(pool);	/* OK: rdma-mr-leak -- every descriptor's MR was deregistered above */
}

static struct srp_fr_pool *srp_create_fr_pool(struct ib_device *device,
					      struct ib_pd *pd, int pool_size,
					      int max_page_list_len)
{
	struct srp_fr_pool *pool;
	struct srp_fr_desc *d;
	struct ib_mr *mr;
	int i, ret = -EINVAL;

	if (pool_size <= 0)
		goto err;
	ret = -ENOMEM;
	pool = kzalloc(sizeof(*pool) + pool_size * sizeof(*d), GFP_KERNEL);
	if (!pool)
		goto err;
	pool->size = pool_size;
	pool->max_page_list_len = max_page_list_len;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->free_list);

	for (i = 0, d = &pool->desc[0]; i < pool->size; i++, d++) {
		mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, max_page_list_len);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			if (ret == -ENOMEM)
				pr_info("%s: ib_alloc_mr() failed. Try to reduce max_cmd_per_lun, max_sect or ch_count\n",
					device->name);
			goto unwind;
		}
		d->mr = mr;
		list_add_tail(&d->entry, &pool->free_list);
	}

	return pool;

unwind:
	while (--i > 0)
		ib_dereg_mr(pool->desc[i].mr);
	kfree(pool);	/* BUG: rdma-mr-leak -- the unwinding loop stops at index 1: desc[0].mr is freed with the pool, never deregistered */
err:
	return ERR_PTR(ret);
}

static struct srp_fr_desc *srp_fr_pool_get(struct srp_fr_pool *pool)
{
	struct srp_fr_desc *d = NULL;
	unsigned long flags;

	spin_lock_irqsave(&pool->lock, flags);
	if (!list_empty(&pool->free_list)) {
		d = list_first_entry(&pool->free_list, typeof(*d), entry);
		list_del(&d->entry);
	}
	spin_unlock_irqrestore(&pool->lock, flags);

	return d;
}

static void srp_fr_pool_put(struct srp_fr_pool *pool, struct srp_fr_desc **desc,
			    int n)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&pool->lock, flags);
	for (i = 0; i < n; i++)
		list_add(&desc[i]->entry, &pool->free_list);
	spin_unlock_irqrestore(&pool->lock, flags);
}

/* ---------------- work request completions ---------------- */

static void srp_handle_qp_err(struct srp_rdma_ch *ch, struct ib_wc *wc,
			      const char *opname)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("failed %s status %s (%d)\n", opname,
		       ib_wc_status_msg(wc->status), wc->status);
	schedule_work(&ch->target->tl_err_work);
}

static void srp_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srp_request *req = container_of(wc->wr_cqe, struct srp_request,
					       reg_cqe);

	pr_err("FAST REG on request %p failed: %s\n", req,
	       ib_wc_status_msg(wc->status));
}

static void srp_inv_rkey_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srp_request *req = container_of(wc->wr_cqe, struct srp_request,
					       reg_cqe);

	pr_err("INV RKEY on request %p failed: %s\n", req,
	       ib_wc_status_msg(wc->status));
}

static int srp_inv_rkey(struct srp_request *req, struct srp_rdma_ch *ch,
			u32 rkey)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = 0,
		.ex.invalidate_rkey = rkey,
	};

	wr.wr_cqe = &req->reg_cqe;
	req->reg_cqe.done = srp_inv_rkey_err_done;
	return ib_post_send(ch->qp, &wr, NULL);
}

/* ---------------- mapping ---------------- */

static void srp_map_desc(struct srp_map_state *state, u64 dma_addr,
			 u32 dma_len, u32 rkey)
{
	struct srp_direct_buf *desc = state->desc;

	desc->va = cpu_to_be64(dma_addr);
	desc->key = cpu_to_be32(rkey);
	desc->len = cpu_to_be32(dma_len);

	state->total_len += dma_len;
	state->desc++;
	state->ndesc++;
}

static int srp_map_finish_fr(struct srp_map_state *state,
			     struct srp_request *req,
			     struct srp_rdma_ch *ch, int sg_nents,
			     unsigned int *sg_offset_p)
{
	struct srp_target_port *target = ch->target;
	struct srp_fr_desc *desc;
	struct ib_reg_wr wr;
	u32 rkey;
	int n, err;

	if (state->next >= state->end) {
		pr_err("Out of MRs (mr_per_cmd = %d)\n", target->mr_per_cmd);
		return -ENOMEM;
	}

	desc = srp_fr_pool_get(ch->fr_pool);
	if (!desc)
		return -ENOMEM;

	rkey = ib_inc_rkey(desc->mr->rkey);
	ib_update_fast_reg_key(desc->mr, rkey);

	n = ib_map_mr_sg(desc->mr, state->sg, sg_nents, sg_offset_p, SZ_4K);
	if (unlikely(n < 0)) {
		srp_fr_pool_put(ch->fr_pool, &desc, 1);	/* OK: rdma-invalidation-leak -- no REG_MR was posted with the new key; the previous I/O invalidated the old one */
		pr_debug("ib_map_mr_sg(%d) returned %d.\n", sg_nents, n);
		return n;
	}

	req->reg_cqe.done = srp_reg_mr_err_done;

	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR;
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = desc->mr;	/* OK: rdma-rkey-reuse -- rotated right after srp_fr_pool_get() */
	wr.key = desc->mr->rkey;
	wr.access = (IB_ACCESS_LOCAL_WRITE |
		     IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE);

	*state->next++ = desc;
	state->nmdesc++;

	srp_map_desc(state, desc->mr->iova, desc->mr->length, desc->mr->rkey);

	err = ib_post_send(ch->qp, &wr.wr, NULL);
	if (unlikely(err)) {
		pr_err("REG_MR post failed (%d)\n", err);
		return err;
	}
	return n;
}

static int srp_map_sg_fr(struct srp_map_state *state, struct srp_rdma_ch *ch,
			 struct srp_request *req, struct scatterlist *scat,
			 int count)
{
	unsigned int sg_offset = 0;

	state->sg = scat;

	while (count) {
		int i, n;

		n = srp_map_finish_fr(state, req, ch, count, &sg_offset);
		if (unlikely(n < 0))
			return n;

		count -= n;
		for (i = 0; i < n; i++)
			state->sg = sg_next(state->sg);
	}
	return 0;
}

/*
 * Register the indirect descriptor table so the target can fetch it with
 * an RDMA READ.
 */
static int srp_map_idb(struct srp_rdma_ch *ch, struct srp_request *req,
		       struct srp_map_state *state, u32 idb_len, u32 *idb_rkey)
{
	struct srp_fr_desc *desc;
	struct scatterlist idb_sg;
	struct ib_reg_wr wr;
	int n;

	if (state->next >= state->end)
		return -ENOMEM;

	desc = srp_fr_pool_get(ch->fr_pool);
	if (!desc)
		return -ENOMEM;

	sg_init_one(&idb_sg, req->indirect_desc, idb_len);
	idb_sg.dma_address = req->indirect_dma_addr;
	idb_sg.dma_length = idb_len;

	n = ib_map_mr_sg(desc->mr, &idb_sg, 1, NULL, SZ_4K);
	if (unlikely(n != 1)) {
		srp_fr_pool_put(ch->fr_pool, &desc, 1);	/* OK: rdma-invalidation-leak -- nothing was registered for this request */
		return n < 0 ? n : -EINVAL;
	}

	req->reg_cqe.done = srp_reg_mr_err_done;

	memset(&wr, 0, sizeof(wr));
	wr.wr.opcode = IB_WR_REG_MR;
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.mr = desc->mr;	/* BUG: rdma-rkey-reuse -- the descriptor comes back from the pool with the key its previous I/O gave the target */
	wr.key = desc->mr->rkey;
	wr.access = IB_ACCESS_REMOTE_READ;

	*state->next++ = desc;
	state->nmdesc++;
	*idb_rkey = desc->mr->rkey;

	return ib_post_send(ch->qp, &wr.wr, NULL);
}

static void srp_unmap_data(struct srp_rdma_ch *ch, struct srp_request *req)
{
	struct srp_target_port *target = ch->target;
	struct srp_fr_desc **pfr;
	int i, res;

	if (!req->nents ||
	    (req->dir != DMA_TO_DEVICE && req->dir != DMA_FROM_DEVICE))
		return;

	for (i = req->nmdesc, pfr = req->fr_list; i > 0; i--, pfr++) {
		res = srp_inv_rkey(req, ch, (*pfr)->mr->rkey);
		if (res < 0) {
			pr_err("Queueing INV WR for rkey %#x failed (%d)\n",
			       (*pfr)->mr->rkey, res);
			schedule_work(&target->tl_err_work);
		}
	}
	if (req->nmdesc) {
		/* BUG: rdma-unmap-before-invalidate -- the LOCAL_INVs above are unsignaled and nothing waits for them */
		srp_fr_pool_put(ch->fr_pool, req->fr_list, req->nmdesc);	/* BUG: rdma-invalidation-leak -- a LOCAL_INV that failed to post is only logged; its descriptor still goes back to the pool */
	}
	req->nmdesc = 0;

	ib_dma_unmap_sg(ch->ibdev, req->sg, req->nents, req->dir);
	req->nents = 0;
}

static int srp_map_data(struct srp_rdma_ch *ch, struct srp_request *req)
{
	struct srp_target_port *target = ch->target;
	struct srp_cmd *cmd = req->cmd;
	struct srp_indirect_buf *indirect_hdr;
	struct srp_map_state state;
	u32 idb_len, idb_rkey;
	int count, ret;
	u8 fmt;

	count = ib_dma_map_sg(ch->ibdev, req->sg, req->nents, req->dir);
	if (unlikely(count == 0))
		return -EIO;

	memset(&state, 0, sizeof(state));
	state.desc = req->indirect_desc;
	state.next = req->fr_list;
	state.end = req->fr_list + target->mr_per_cmd;

	ret = srp_map_sg_fr(&state, ch, req, req->sg, count);
	req->nmdesc = state.nmdesc;
	if (ret < 0)
		goto unmap;

	if (state.ndesc == 1) {
		/* a single memory descriptor: use a direct descriptor */
		memcpy(cmd->add_data, req->indirect_desc,
		       sizeof(struct srp_direct_buf));
		fmt = SRP_DATA_DESC_DIRECT;
	} else {
		idb_len = state.ndesc * sizeof(struct srp_direct_buf);
		ret = srp_map_idb(ch, req, &state, idb_len, &idb_rkey);
		req->nmdesc = state.nmdesc;
		if (ret < 0)
			goto unmap;

		indirect_hdr = (void *)cmd->add_data;
		indirect_hdr->table_desc.va = cpu_to_be64(req->indirect_dma_addr);
		indirect_hdr->table_desc.key = cpu_to_be32(idb_rkey);
		indirect_hdr->table_desc.len = cpu_to_be32(idb_len);
		indirect_hdr->len = cpu_to_be32(state.total_len);
		fmt = SRP_DATA_DESC_INDIRECT;
	}

	if (req->dir == DMA_TO_DEVICE)
		cmd->buf_fmt = fmt << 4;
	else
		cmd->buf_fmt = fmt;
	return 0;

unmap:
	srp_unmap_data(ch, req);
	if (ret == -ENOMEM && req->nmdesc >= target->mr_pool_size)
		ret = -E2BIG;
	return ret;
}

/* ---------------- request life cycle ---------------- */

static void srp_free_req(struct srp_rdma_ch *ch, struct srp_request *req)
{
	unsigned long flags;

	srp_unmap_data(ch, req);

	spin_lock_irqsave(&ch->lock, flags);
	list_add_tail(&req->list, &ch->free_reqs);	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the descriptors went back inside srp_unmap_data(); the request itself holds no key */
	spin_unlock_irqrestore(&ch->lock, flags);
}

static void srp_recv_done(struct srp_rdma_ch *ch, struct ib_wc *wc,
			  struct srp_request *req)
{
	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		srp_handle_qp_err(ch, wc, "RECV");
		return;
	}
	if (req)
		srp_free_req(ch, req);
}

static int srp_create_ch_mrs(struct srp_rdma_ch *ch)
{
	struct srp_target_port *target = ch->target;
	struct srp_fr_pool *fr_pool;

	fr_pool = srp_create_fr_pool(ch->ibdev, ch->pd, target->mr_pool_size,
				     target->max_pages_per_mr);
	if (IS_ERR(fr_pool))
		return PTR_ERR(fr_pool);

	srp_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = fr_pool;
	return 0;
}

static void srp_free_ch_ib(struct srp_rdma_ch *ch)
{
	if (!ch->qp)
		return;
	ib_drain_qp(ch->qp);
	ib_destroy_qp(ch->qp);
	ch->qp = NULL;
	srp_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = NULL;
}

struct srp_reg_ops {
	int (*create_mrs)(struct srp_rdma_ch *ch);
	void (*free_ch)(struct srp_rdma_ch *ch);
	int (*map_data)(struct srp_rdma_ch *ch, struct srp_request *req);
	void (*recv_done)(struct srp_rdma_ch *ch, struct ib_wc *wc,
			  struct srp_request *req);
};

const struct srp_reg_ops srp_fr_reg_ops = {
	.create_mrs	= srp_create_ch_mrs,
	.free_ch	= srp_free_ch_ib,
	.map_data	= srp_map_data,
	.recv_done	= srp_recv_done,
};

MODULE_DESCRIPTION("SRP initiator fast-registration path");
MODULE_LICENSE("GPL");
