// SPDX-License-Identifier: GPL-2.0
/*
 * rfs: registration and invalidation of an invented remote-filesystem client
 * ("rfs") whose RPCs carry chunk lists, in the style of xprtrdma's
 * frwr_ops.c (written fresh).
 *
 * Every RPC registers its payload with one or more pool MRs (a REG_MR per
 * MR, key rotated each time), and advertises handle/length/offset triples.
 * When the reply arrives, rfs_unmap_sync() chains one LOCAL_INV per MR,
 * signals only the last one, waits for it and only then unmaps and recycles
 * the MRs: the in-order send queue guarantees the earlier LOCAL_INVs ran.
 * rfs_unmap_async() does the same from the last LOCAL_INV's completion.
 *
 * The bug is on the async path's error branch: when ib_post_send() fails,
 * the MRs of the chain that was not posted are put back on the free list
 * with their keys still valid for the server.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/completion.h>
#include <rdma/ib_verbs.h>

struct rfs_xprt;

struct rfs_mr {
	struct list_head	mr_list;
	struct rfs_xprt		*mr_xprt;
	struct ib_mr		*mr;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct ib_cqe		mr_cqe;
	struct completion	mr_linv_done;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
	struct rfs_req		*mr_req;
};

struct rfs_req {
	struct list_head	rl_registered;
	struct list_head	rl_free_mrs;
	struct ib_send_wr	rl_send_wr;
};

struct rfs_xprt {
	struct ib_device	*device;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct list_head	mrs;
	u32			max_fr_depth;
};

void rfs_force_disconnect(struct rfs_xprt *x);
void rfs_complete_rqst(struct rfs_req *req);

static void rfs_mr_put(struct rfs_mr *mr)
{
	if (mr->mr_dir != DMA_NONE) {
		ib_dma_unmap_sg(mr->mr_xprt->device, mr->mr_sg, mr->mr_nents,
				mr->mr_dir);
		mr->mr_dir = DMA_NONE;
	}
	list_add_tail(&mr->mr_list, &mr->mr_xprt->mrs);
}

int rfs_mr_init(struct rfs_xprt *x, struct rfs_mr *mr)
{
	struct ib_mr *frmr;

	/* BUG: rdma-local-mr-management -- the ULP allocates its own FRWR MRs */
	frmr = ib_alloc_mr(x->pd, IB_MR_TYPE_MEM_REG, x->max_fr_depth); /* OK: rdma-registration-in-datapath -- MRs are created when the transport's MR list is filled, not per RPC */
	if (IS_ERR(frmr))
		return PTR_ERR(frmr);

	mr->mr_sg = kcalloc(x->max_fr_depth, sizeof(*mr->mr_sg), GFP_KERNEL);
	if (!mr->mr_sg) {
		/* BUG: rdma-local-mr-management -- the ULP deregisters its MR */
		ib_dereg_mr(frmr); /* OK: rdma-mr-leak -- released before the error return */
		return -ENOMEM;
	}
	mr->mr = frmr;
	mr->mr_xprt = x;
	mr->mr_dir = DMA_NONE;
	init_completion(&mr->mr_linv_done);
	sg_init_table(mr->mr_sg, x->max_fr_depth);
	return 0;
}

int rfs_map(struct rfs_xprt *x, struct rfs_mr *mr, int nsegs, bool writing)
{
	struct ib_mr *ibmr = mr->mr;
	int dma_nents, n;
	u8 key;

	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = nsegs;
	dma_nents = ib_dma_map_sg(x->device, mr->mr_sg, mr->mr_nents, mr->mr_dir);
	if (!dma_nents)
		return -EIO;

	/* BUG: rdma-local-mr-management -- the ULP maps pages into its MR */
	n = ib_map_mr_sg(ibmr, mr->mr_sg, dma_nents, NULL, SZ_4K);
	if (n != dma_nents) {
		rfs_mr_put(mr);
		return -EIO;
	}

	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	mr->mr_regwr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	mr->mr_regwr.mr = ibmr; /* OK: rdma-rkey-reuse -- the low byte of the key is advanced before every registration */
	mr->mr_regwr.key = ibmr->rkey;
	/* OK: rdma-access-flags-invalid -- the writable branch carries LOCAL_WRITE; the read-only one needs none */
	mr->mr_regwr.access = writing ?
			      IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			      IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = ibmr->length;
	mr->mr_offset = ibmr->iova;
	return 0;
}


static void rfs_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rfs_mr *mr = container_of(wc->wr_cqe, struct rfs_mr, mr_cqe);

	complete(&mr->mr_linv_done);
}

void rfs_unmap_sync(struct rfs_xprt *x, struct rfs_req *req)
{
	struct ib_send_wr *first, **prev, *last;
	struct rfs_mr *mr, *tmp;
	int rc;

	prev = &first;
	mr = NULL;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = &mr->mr_invwr;
		last->next = NULL;
		last->wr_cqe = &mr->mr_cqe;
		last->sg_list = NULL;
		last->num_sge = 0;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = 0;
		last->ex.invalidate_rkey = mr->mr_handle;
		*prev = last;
		prev = &last->next;
	}
	if (!mr)
		return;
	mr = container_of(last, struct rfs_mr, mr_invwr);

	/* Strong send queue ordering guarantees that when the last WR in
	 * the chain completes, all WRs in the chain are complete.
	 */
	mr->mr_cqe.done = rfs_wc_localinv_wake;
	reinit_completion(&mr->mr_linv_done);
	last->send_flags = IB_SEND_SIGNALED;

	rc = ib_post_send(x->qp, first, NULL);
	if (!rc) {
		wait_for_completion(&mr->mr_linv_done);
		list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
			list_del(&mr->mr_list);
			rfs_mr_put(mr); /* OK: rdma-unmap-before-invalidate -- the signaled last LOCAL_INV of the chain has completed */
		}
		return;
	}

	/* the chain was not (fully) posted: let the disconnect clean up */
	rfs_force_disconnect(x);
}

static void rfs_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rfs_mr *mr = container_of(wc->wr_cqe, struct rfs_mr, mr_cqe);
	struct rfs_req *req = mr->mr_req;
	struct rfs_mr *pos, *tmp;

	list_for_each_entry_safe(pos, tmp, &req->rl_registered, mr_list) {
		list_del(&pos->mr_list);
		/* BUG: rdma-invalidation-leak -- wc->status is never looked at: after a flushed or failed LOCAL_INV the rkeys are still valid (xprtrdma's frwr_wc_localinv_done returns early on failure) */
		rfs_mr_put(pos); /* OK: rdma-unmap-before-invalidate -- runs from the completion of the chain's last, signaled LOCAL_INV */
	}
	rfs_complete_rqst(req);
}

void rfs_unmap_async(struct rfs_xprt *x, struct rfs_req *req)
{
	struct ib_send_wr *first, *last, **prev;
	struct rfs_mr *mr, *tmp;
	int rc;

	prev = &first;
	last = NULL;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = &mr->mr_invwr;
		last->next = NULL;
		last->wr_cqe = &mr->mr_cqe;
		last->num_sge = 0;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = 0;
		last->ex.invalidate_rkey = mr->mr_handle;
		mr->mr_req = req;
		*prev = last;
		prev = &last->next;
	}
	if (!last)
		return;

	mr = container_of(last, struct rfs_mr, mr_invwr);
	mr->mr_cqe.done = rfs_wc_localinv_done;
	last->send_flags = IB_SEND_SIGNALED;

	rc = ib_post_send(x->qp, first, NULL);
	if (!rc)
		return;

	/* nothing will complete: recycle the MRs and finish the RPC */
	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del(&mr->mr_list);
		rfs_mr_put(mr); /* BUG: rdma-invalidation-leak -- the LOCAL_INV chain was not posted; the MRs return to the free list with keys the server still holds */
	}
	rfs_complete_rqst(req);
	rfs_force_disconnect(x);
}
