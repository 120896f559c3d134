// SPDX-License-Identifier: GPL-2.0
/*
 * za_srp_ini.c - SRP-style SCSI initiator channel: per-request arrays of
 * fast-registration MRs, memory descriptors built into the SRP_CMD, and
 * invalidation when the command completes or is aborted.
 *
 * Each request owns target->mr_per_cmd FR MRs (req->fr[]), allocated when
 * the channel's request ring is built.  Mapping a command walks the DMA
 * mapped scatterlist, registers one chunk per MR (each REG_MR is posted
 * as soon as it is built) and, for more than one chunk, registers the
 * indirect descriptor table with the next free MR of the request.
 * Requests are indexed by tag; completing a command unmaps its data.
 *
 * Correct: allocation of a request's MRs with its unwinding loop, the
 * data-chunk registration, the abort path that waits for its signaled
 * LOCAL_INV before unmapping.
 * Not correct: the ring allocation loses the MRs of the request it was
 * filling; a map failure after some REG_MRs went out unmaps without
 * invalidating them; the indirect table reuses the MR's key; the normal
 * completion path unmaps right after posting unsignaled LOCAL_INVs and
 * also after seeing such a post fail.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed for this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define ZS_MAX_MR_PER_CMD	8
#define ZS_MR_PAGE_SIZE		4096
#define SRP_DATA_DESC_DIRECT	1
#define SRP_DATA_DESC_INDIRECT	2

#define shost_printk(lvl, t, fmt, ...) \
	printk(lvl "scsi host%d: " fmt, (t)->host_no, ##__VA_ARGS__)

struct srp_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct srp_cmd {
	u8			opcode;
	u8			buf_fmt;
	u8			data_out_desc_cnt;
	u8			data_in_desc_cnt;
	u64			tag;
	struct srp_direct_buf	desc[1];
};

struct zs_fr_desc {
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	bool			valid;		/* registered, key not yet invalidated */
};

struct zs_request {
	struct zs_fr_desc	fr[ZS_MAX_MR_PER_CMD];
	int			nmdesc;
	struct srp_direct_buf	*indirect_desc;
	u64			indirect_dma_addr;
	struct scatterlist	idb_sg;
	struct scatterlist	*sg;
	int			sg_cnt;
	enum dma_data_direction	dir;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	int			inv_status;
	void			*scmnd;
};

struct zs_target {
	int			host_no;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	unsigned int		mr_per_cmd;
	unsigned int		max_pages_per_mr;
	unsigned int		indirect_size;
	unsigned int		req_ring_size;
	struct work_struct	tl_err_work;
};

struct zs_rdma_ch {
	struct zs_target	*target;
	struct ib_qp		*qp;
	struct zs_request	*req_ring;
};

static void zs_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("FAST REG failed status %s (%d)\n",
		       ib_wc_status_msg(wc->status), wc->status);
}

static void zs_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zs_request *req = container_of(wc->wr_cqe, struct zs_request,
					      inv_cqe);

	req->inv_status = wc->status;
	complete(&req->inv_done);
}

static void zs_free_req_mrs(struct zs_request *req, unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		if (req->fr[i].mr)
			ib_dereg_mr(req->fr[i].mr);	/* OK: rdma-invalidation-leak -- deregistration kills the key */
		req->fr[i].mr = NULL;
	}
}

static int zs_alloc_req_mrs(struct zs_target *target, struct zs_request *req)
{
	struct ib_mr *mr;
	int i, ret;

	for (i = 0; i < target->mr_per_cmd; i++) {
		mr = ib_alloc_mr(target->pd, IB_MR_TYPE_MEM_REG,
				 target->max_pages_per_mr);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto err_unwind;
		}
		req->fr[i].mr = mr;
		req->fr[i].valid = false;
	}
	return 0;

err_unwind:
	while (--i >= 0) {
		ib_dereg_mr(req->fr[i].mr);	/* OK: rdma-mr-leak -- every MR this call allocated is released */
		req->fr[i].mr = NULL;
	}
	return ret;
}

int zs_alloc_req_ring(struct zs_rdma_ch *ch)
{
	struct zs_target *target = ch->target;
	struct zs_request *req;
	int i, ret = -ENOMEM;

	ch->req_ring = kcalloc(target->req_ring_size, sizeof(*ch->req_ring),
			       GFP_KERNEL);
	if (!ch->req_ring)
		return -ENOMEM;

	for (i = 0; i < target->req_ring_size; i++) {
		req = &ch->req_ring[i];
		ret = zs_alloc_req_mrs(target, req);
		if (ret)
			goto err;
		req->indirect_desc = kmalloc(target->indirect_size, GFP_KERNEL);
		if (req->indirect_desc)
			req->indirect_dma_addr =
				ib_dma_map_single(target->ibdev,
						  req->indirect_desc,
						  target->indirect_size,
						  DMA_TO_DEVICE);
		if (!req->indirect_desc ||
		    ib_dma_mapping_error(target->ibdev,
					 req->indirect_dma_addr)) {
			ret = -ENOMEM;
			goto err;	/* BUG: rdma-mr-leak -- request i already holds its MRs; the unwinding below stops short of it and frees the ring */
		}
		init_completion(&req->inv_done);
	}
	return 0;

err:
	while (--i >= 0) {
		zs_free_req_mrs(&ch->req_ring[i], target->mr_per_cmd);
		kfree(ch->req_ring[i].indirect_desc);
	}
	kfree(ch->req_ring);
	ch->req_ring = NULL;
	return ret;
}

void zs_free_req_ring(struct zs_rdma_ch *ch)
{
	int i;

	if (!ch->req_ring)
		return;
	for (i = 0; i < ch->target->req_ring_size; i++) {
		zs_free_req_mrs(&ch->req_ring[i], ch->target->mr_per_cmd);
		kfree(ch->req_ring[i].indirect_desc);
	}
	kfree(ch->req_ring);
	ch->req_ring = NULL;
}

static void zs_map_desc(struct srp_direct_buf *buf, u64 va, u32 len, u32 rkey)
{
	buf->va = cpu_to_be64(va);
	buf->key = cpu_to_be32(rkey);
	buf->len = cpu_to_be32(len);
}

/*
 * Register up to max_pages_per_mr pages of @sg with req->fr[idx] and post
 * the REG_MR.  Returns the number of SG entries consumed.
 */
static int zs_map_finish_fr(struct zs_rdma_ch *ch, struct zs_request *req,
			    int idx, struct scatterlist *sg, int sg_nents,
			    struct srp_direct_buf *buf)
{
	struct zs_fr_desc *d = &req->fr[idx];
	unsigned int sg_offset = 0;
	int n, err;

	ib_update_fast_reg_key(d->mr, ib_inc_rkey(d->mr->rkey));

	n = ib_map_mr_sg(d->mr, sg, sg_nents, &sg_offset, ZS_MR_PAGE_SIZE);
	if (unlikely(n < 0))
		return n;

	req->reg_cqe.done = zs_reg_done;
	d->reg_wr.wr.next = NULL;
	d->reg_wr.wr.opcode = IB_WR_REG_MR;
	d->reg_wr.wr.wr_cqe = &req->reg_cqe;
	d->reg_wr.wr.num_sge = 0;
	d->reg_wr.wr.send_flags = 0;
	d->reg_wr.mr = d->mr;	/* OK: rdma-rkey-reuse -- key incremented before the map */
	d->reg_wr.key = d->mr->rkey;
	d->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			   IB_ACCESS_REMOTE_WRITE;

	zs_map_desc(buf, d->mr->iova, d->mr->length, d->mr->rkey);

	err = ib_post_send(ch->qp, &d->reg_wr.wr, NULL);
	if (unlikely(err))
		return err;
	d->valid = true;
	return n;
}

/* Register the indirect descriptor table itself with the next free MR. */
static int zs_map_idb(struct zs_rdma_ch *ch, struct zs_request *req,
		      u32 idb_len, u32 *idb_rkey)
{
	struct zs_fr_desc *d;
	int n, err;

	if (req->nmdesc >= ch->target->mr_per_cmd)
		return -ENOMEM;
	d = &req->fr[req->nmdesc];

	sg_init_one(&req->idb_sg, req->indirect_desc, idb_len);
	req->idb_sg.dma_address = req->indirect_dma_addr;
	req->idb_sg.dma_length = idb_len;

	n = ib_map_mr_sg(d->mr, &req->idb_sg, 1, NULL, ZS_MR_PAGE_SIZE);
	if (unlikely(n != 1))
		return n < 0 ? n : -EINVAL;

	req->reg_cqe.done = zs_reg_done;
	memset(&d->reg_wr, 0, sizeof(d->reg_wr));
	d->reg_wr.wr.opcode = IB_WR_REG_MR;
	d->reg_wr.wr.wr_cqe = &req->reg_cqe;
	d->reg_wr.mr = d->mr;	/* BUG: rdma-rkey-reuse -- the request's MR is registered again under the key of its previous command */
	d->reg_wr.key = d->mr->rkey;
	d->reg_wr.access = IB_ACCESS_REMOTE_READ;

	err = ib_post_send(ch->qp, &d->reg_wr.wr, NULL);
	if (unlikely(err))
		return err;
	d->valid = true;
	req->nmdesc++;
	*idb_rkey = d->mr->rkey;
	return 0;
}

int zs_map_data(struct zs_rdma_ch *ch, struct zs_request *req,
		struct srp_cmd *cmd)
{
	struct zs_target *target = ch->target;
	struct srp_direct_buf *buf = req->indirect_desc;
	struct scatterlist *sg;
	int count, i, n, ret;
	u32 idb_rkey;

	count = ib_dma_map_sg(target->ibdev, req->sg, req->sg_cnt, req->dir);
	if (unlikely(count == 0))
		return -EIO;

	sg = req->sg;
	for (i = 0; count > 0; i++) {
		if (i >= target->mr_per_cmd) {
			ret = -E2BIG;
			goto err_unwind;
		}
		n = zs_map_finish_fr(ch, req, i, sg, count, &buf[i]);
		if (n < 0) {
			ret = n;
			goto err_unwind;
		}
		count -= n;
		while (n--)
			sg = sg_next(sg);
	}
	req->nmdesc = i;

	if (i == 1) {
		cmd->buf_fmt = SRP_DATA_DESC_DIRECT;
		cmd->desc[0] = buf[0];
		return 0;
	}

	ret = zs_map_idb(ch, req, i * sizeof(*buf), &idb_rkey);
	if (ret)
		goto err_unwind;
	cmd->buf_fmt = SRP_DATA_DESC_INDIRECT;
	zs_map_desc(&cmd->desc[0], req->indirect_dma_addr, i * sizeof(*buf),
		    idb_rkey);
	return 0;

err_unwind:
	/* nothing references these registrations yet */
	while (i-- > 0)
		req->fr[i].valid = false;
	req->nmdesc = 0;
	/* BUG: rdma-invalidation-leak -- the REG_MRs already posted for the earlier chunks stay valid while their pages are unmapped */
	ib_dma_unmap_sg(target->ibdev, req->sg, req->sg_cnt, req->dir);
	return ret;
}

static int zs_inv_rkey(struct zs_rdma_ch *ch, struct zs_request *req,
		       struct zs_fr_desc *d, u32 rkey)
{
	d->inv_wr.next = NULL;
	d->inv_wr.opcode = IB_WR_LOCAL_INV;
	d->inv_wr.wr_cqe = &req->reg_cqe;
	d->inv_wr.send_flags = 0;
	d->inv_wr.num_sge = 0;
	d->inv_wr.ex.invalidate_rkey = rkey;

	return ib_post_send(ch->qp, &d->inv_wr, NULL);
}

/* Normal completion of a command: called from the response handler. */
void zs_unmap_data(struct zs_rdma_ch *ch, struct zs_request *req)
{
	struct zs_target *target = ch->target;
	int i, res;

	for (i = 0; i < req->nmdesc; i++) {
		struct zs_fr_desc *d = &req->fr[i];

		if (!d->valid)
			continue;
		res = zs_inv_rkey(ch, req, d, d->mr->rkey);
		if (res < 0) {
			shost_printk(KERN_ERR, target,
				     "Queueing INV WR for rkey %#x failed (%d)\n",
				     d->mr->rkey, res);
			queue_work(system_wq, &target->tl_err_work);
		}
		d->valid = false;
	}
	req->nmdesc = 0;
	/* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- unmapped right after posting unsignaled LOCAL_INVs, and also after one of those posts failed */
	ib_dma_unmap_sg(target->ibdev, req->sg, req->sg_cnt, req->dir);
}

/*
 * Error handler abort: the command is still owned by the target, so
 * invalidate everything and wait before giving the pages back.
 */
int zs_abort_unmap(struct zs_rdma_ch *ch, struct zs_request *req)
{
	struct zs_target *target = ch->target;
	struct ib_send_wr *first = NULL, *last = NULL;
	int i, ret;

	for (i = 0; i < req->nmdesc; i++) {
		struct zs_fr_desc *d = &req->fr[i];

		if (!d->valid)
			continue;
		memset(&d->inv_wr, 0, sizeof(d->inv_wr));
		d->inv_wr.opcode = IB_WR_LOCAL_INV;
		d->inv_wr.wr_cqe = &req->reg_cqe;
		d->inv_wr.ex.invalidate_rkey = d->mr->rkey;
		if (last)
			last->next = &d->inv_wr;
		else
			first = &d->inv_wr;
		last = &d->inv_wr;
	}

	if (first) {
		req->inv_cqe.done = zs_inv_done;
		last->wr_cqe = &req->inv_cqe;
		last->send_flags = IB_SEND_SIGNALED;
		reinit_completion(&req->inv_done);

		ret = ib_post_send(ch->qp, first, NULL);
		if (ret) {
			/* keep the pages mapped; the reconnect tears the MRs down */
			queue_work(system_wq, &target->tl_err_work);
			return ret;	/* OK: rdma-invalidation-leak -- nothing is released when the LOCAL_INVs could not be posted */
		}
		wait_for_completion(&req->inv_done);
		if (req->inv_status != IB_WC_SUCCESS) {
			queue_work(system_wq, &target->tl_err_work);
			return -EIO;
		}
	}

	for (i = 0; i < req->nmdesc; i++)
		req->fr[i].valid = false;
	req->nmdesc = 0;
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV at the end of the chain completed */
	ib_dma_unmap_sg(target->ibdev, req->sg, req->sg_cnt, req->dir);
	return 0;
}

MODULE_DESCRIPTION("SRP-style initiator channel");
MODULE_LICENSE("GPL");
