// SPDX-License-Identifier: GPL-2.0
/*
 * mr.c - RMBs and send buffers of a link group and their per-link MRs.
 *
 * An RMB is mapped and registered on every active link of the group; the
 * rkey of the link's MR is what the peer uses to RDMA WRITE into it. A send
 * buffer is only DMA mapped, unless it is virtually contiguous (is_vm):
 * then it gets an MR with local access only, so that a single SGE covers
 * all of its pages. Registration runs when a buffer is created, not per
 * CDC message.
 */

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include "smcx.h"

static int smcx_buf_sizes[SMCX_RMBE_SIZES] = {
	16384, 32768, 65536, 131072, 262144, 524288, 1048576,
};

void smcx_buf_unmap_link(struct smcx_buf_desc *buf, struct smcx_link *lnk)
{
	int idx = lnk->link_idx;

	if (!buf->is_map_ib[idx])
		return;
	if (buf->mr[idx]) {
		ib_dereg_mr(buf->mr[idx]);	/* BUG: rdma-local-mr-management -- per-link MRs of the buffer are managed by hand */
		buf->mr[idx] = NULL;
	}
	ib_dma_unmap_sg(lnk->ibdev, buf->sgt[idx].sgl, buf->sgt[idx].orig_nents,
			buf->is_rmb ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
	sg_free_table(&buf->sgt[idx]);
	buf->is_map_ib[idx] = false;
}

static int smcx_buf_map_link(struct smcx_buf_desc *buf, struct smcx_link *lnk)
{
	int idx = lnk->link_idx;
	struct scatterlist *sg;
	int i, nents, rc;

	rc = sg_alloc_table(&buf->sgt[idx], buf->nr_pages, GFP_KERNEL);
	if (rc)
		return rc;
	for_each_sg(buf->sgt[idx].sgl, sg, buf->nr_pages, i)
		sg_set_page(sg, smcx_buf_page(buf, i), PAGE_SIZE, 0);

	nents = ib_dma_map_sg(lnk->ibdev, buf->sgt[idx].sgl, buf->nr_pages,
			      buf->is_rmb ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
	if (nents <= 0) {
		sg_free_table(&buf->sgt[idx]);
		return -ENOMEM;
	}
	buf->sgt[idx].nents = nents;
	buf->is_map_ib[idx] = true;

	/* physically contiguous send buffers need no MR: local_dma_lkey */
	if (!buf->is_rmb && !buf->is_vm)
		return 0;

	buf->mr[idx] = ib_alloc_mr(lnk->roce_pd, IB_MR_TYPE_MEM_REG,	/* BUG: rdma-local-mr-management -- the ULP allocates its own MR per buffer and link */
				   buf->nr_pages);
	if (IS_ERR(buf->mr[idx])) {
		rc = PTR_ERR(buf->mr[idx]);
		buf->mr[idx] = NULL;
		goto err_unmap;
	}
	rc = ib_map_mr_sg(buf->mr[idx], buf->sgt[idx].sgl, nents, NULL,	/* BUG: rdma-local-mr-management -- mapped by hand */
			  PAGE_SIZE);
	if (rc != nents) {
		rc = rc < 0 ? rc : -EINVAL;
		goto err_unmap;
	}
	rc = smcx_wr_reg_send(lnk, buf->mr[idx], buf->is_rmb);
	if (rc)
		goto err_unmap;
	return 0;

err_unmap:
	smcx_buf_unmap_link(buf, lnk);
	return rc;
}

struct smcx_buf_desc *smcx_buf_create(struct smcx_lgr *lgr, bool is_rmb,
				      int size_idx)
{
	struct smcx_buf_desc *buf;
	int i, rc = 0;

	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return NULL;
	buf->is_rmb = is_rmb;
	buf->len = smcx_buf_sizes[size_idx];
	buf->nr_pages = DIV_ROUND_UP(buf->len, PAGE_SIZE);
	buf->is_vm = !is_rmb && buf->len > 65536;
	buf->cpu_addr = kzalloc(buf->len, GFP_KERNEL);
	if (!buf->cpu_addr) {
		kfree(buf);
		return NULL;
	}

	for (i = 0; i < SMCX_LINKS_PER_LGR; i++) {
		if (!lgr->lnk[i].active)
			continue;
		rc = smcx_buf_map_link(buf, &lgr->lnk[i]);
		if (rc)
			break;
	}
	if (rc) {
		while (--i >= 0)
			smcx_buf_unmap_link(buf, &lgr->lnk[i]);
		kfree(buf->cpu_addr);
		kfree(buf);
		return NULL;
	}

	mutex_lock(&lgr->bufs_lock);
	list_add(&buf->list, is_rmb ? &lgr->rmbs[size_idx] : &lgr->sndbufs[size_idx]);
	mutex_unlock(&lgr->bufs_lock);
	return buf;
}

void smcx_buf_free(struct smcx_lgr *lgr, struct smcx_buf_desc *buf)
{
	int i;

	mutex_lock(&lgr->bufs_lock);
	list_del(&buf->list);
	mutex_unlock(&lgr->bufs_lock);
	for (i = 0; i < SMCX_LINKS_PER_LGR; i++)
		smcx_buf_unmap_link(buf, &lgr->lnk[i]);
	kfree(buf->cpu_addr);
	kfree(buf);
}

/* The rkey a CLC/LLC message announces for this RMB on this link. */
u32 smcx_rmb_rkey(struct smcx_buf_desc *rmb, struct smcx_link *lnk)
{
	return rmb->mr[lnk->link_idx]->rkey;
}
