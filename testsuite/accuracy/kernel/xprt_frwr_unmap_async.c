// SPDX-License-Identifier: GPL-2.0
/*
 * xfr: FRWR memory registration for an RPC-over-RDMA client transport, in
 * the shape of net/sunrpc/xprtrdma/frwr_ops.c around Linux 4.5, before
 * "xprtrdma: Introduce ro_unmap_sync method" (Chuck Lever, 2015). Written
 * fresh for the held-out batch.
 *
 * xfr_op_map() takes an MW from the transport's free list, advances the
 * key byte (++key, as xprtrdma did), fast-registers the chunk and hands
 * the handle to the chunk encoder, which puts it on the wire.
 *
 * The reply handler releases the chunks with the old asynchronous
 * xfr_op_unmap(): it DMA-unmaps the pages before it even posts the
 * LOCAL_INV, posts the LOCAL_INV unsignaled, and puts the MW straight back
 * on the free list. The server can still write into the pages (and, via
 * the next user of the MW, into someone else's pages) until the LOCAL_INV
 * executes. The commit above added the synchronous method, modelled by
 * xfr_op_unmap_sync(): the LOCAL_INVs are chained, the last one is
 * signaled and waited for, and only then are pages unmapped and MWs
 * recycled.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>

#define XFR_CQCOUNT_INIT	32

enum xfr_frmr_state {
	FRMR_IS_INVALID,
	FRMR_IS_VALID,
	FRMR_IS_STALE,
};

struct xfr_mw {
	struct list_head	mw_list;
	struct ib_mr		*fr_mr;
	struct scatterlist	*fr_sg;
	int			fr_nents;
	enum dma_data_direction	fr_dir;
	enum xfr_frmr_state	fr_state;
	struct ib_reg_wr	fr_regwr;
	struct ib_send_wr	fr_invwr;
	struct ib_cqe		fr_cqe;
	struct completion	fr_linv_done;
	u32			mw_handle;
	u64			mw_offset;
	u32			mw_length;
};

struct xfr_xprt {
	struct ib_device	*device;
	struct ib_qp		*qp;
	spinlock_t		mw_lock;
	struct list_head	mws;		/* free list */
	struct list_head	stale_mws;	/* recovered by the connect worker */
	int			cqcount;
};

struct xfr_req {
	struct list_head	rl_registered;
};

static struct xfr_mw *xfr_get_mw(struct xfr_xprt *r_xprt)
{
	struct xfr_mw *mw = NULL;

	spin_lock(&r_xprt->mw_lock);
	if (!list_empty(&r_xprt->mws)) {
		mw = list_first_entry(&r_xprt->mws, struct xfr_mw, mw_list);
		list_del_init(&mw->mw_list);
	}
	spin_unlock(&r_xprt->mw_lock);
	return mw;
}

static void xfr_put_mw(struct xfr_xprt *r_xprt, struct xfr_mw *mw)
{
	spin_lock(&r_xprt->mw_lock);
	list_add_tail(&mw->mw_list, &r_xprt->mws);
	spin_unlock(&r_xprt->mw_lock);
}

static void xfr_defer_recovery(struct xfr_xprt *r_xprt, struct xfr_mw *mw)
{
	mw->fr_state = FRMR_IS_STALE;
	spin_lock(&r_xprt->mw_lock);
	list_add_tail(&mw->mw_list, &r_xprt->stale_mws);
	spin_unlock(&r_xprt->mw_lock);
}

/* Send-queue accounting of the era: signal one WR in XFR_CQCOUNT_INIT. */
static int xfr_send_flags(struct xfr_xprt *r_xprt)
{
	if (--r_xprt->cqcount > 0)
		return 0;
	r_xprt->cqcount = XFR_CQCOUNT_INIT;
	return IB_SEND_SIGNALED;
}

/**
 * xfr_op_map - register one chunk for the server
 * @r_xprt: the transport
 * @sg: pages of the chunk
 * @nents: number of entries in @sg
 * @writing: true when the server will write into the chunk
 * @req: the RPC; the MW is added to its rl_registered list
 * @handle: out: the rkey to encode into the chunk list
 */
int xfr_op_map(struct xfr_xprt *r_xprt, struct scatterlist *sg, int nents,
	       bool writing, struct xfr_req *req, u32 *handle)
{
	struct xfr_mw *mw;
	struct ib_mr *mr;
	u8 key;
	int n, rc;

	mw = xfr_get_mw(r_xprt);
	if (!mw)
		return -ENOBUFS;
	mr = mw->fr_mr;

	mw->fr_sg = sg;
	mw->fr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mw->fr_nents = ib_dma_map_sg(r_xprt->device, sg, nents, mw->fr_dir);
	if (!mw->fr_nents)
		goto out_dmamap_err;

	/* BUG: rdma-local-mr-management -- the ULP maps the chunk into its own MR */
	n = ib_map_mr_sg(mr, sg, mw->fr_nents, NULL, PAGE_SIZE);
	if (unlikely(n != mw->fr_nents))
		goto out_mapmr_err;

	/* Bump the key */
	key = (u8)(mr->rkey & 0x000000FF);
	ib_update_fast_reg_key(mr, ++key);

	memset(&mw->fr_regwr, 0, sizeof(mw->fr_regwr));
	mw->fr_regwr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	mw->fr_regwr.wr.wr_id = (uintptr_t)mw;
	mw->fr_regwr.mr = mr; /* OK: rdma-rkey-reuse -- the key byte was incremented just above */
	mw->fr_regwr.key = mr->rkey;
	mw->fr_regwr.access = writing ?
			      IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			      IB_ACCESS_REMOTE_READ;
	mw->fr_regwr.wr.send_flags = xfr_send_flags(r_xprt);

	rc = ib_post_send(r_xprt->qp, &mw->fr_regwr.wr, NULL);
	if (rc)
		goto out_senderr;

	mw->fr_state = FRMR_IS_VALID;
	mw->mw_handle = mr->rkey;
	mw->mw_offset = mr->iova;
	mw->mw_length = mr->length;
	list_add_tail(&mw->mw_list, &req->rl_registered);
	*handle = mw->mw_handle;
	return n;

out_mapmr_err:
	pr_err("xfr: failed to map mr %p (%d/%d)\n", mr, n, mw->fr_nents);
	ib_dma_unmap_sg(r_xprt->device, sg, nents, mw->fr_dir);
out_dmamap_err:
	xfr_put_mw(r_xprt, mw);
	return -EIO;

out_senderr:
	pr_err("xfr: REG_MR post failed (%d)\n", rc);
	ib_dma_unmap_sg(r_xprt->device, sg, nents, mw->fr_dir);
	xfr_defer_recovery(r_xprt, mw);
	return -ENOTCONN;
}

/**
 * xfr_op_unmap - asynchronously invalidate the chunks of a finished RPC
 * @r_xprt: the transport
 * @req: the RPC whose reply was received
 *
 * Called from the reply handler. The caller continues as soon as the
 * LOCAL_INVs are posted.
 */
void xfr_op_unmap(struct xfr_xprt *r_xprt, struct xfr_req *req)
{
	struct xfr_mw *mw, *tmp;
	int rc;

	list_for_each_entry_safe(mw, tmp, &req->rl_registered, mw_list) {
		list_del_init(&mw->mw_list);

		memset(&mw->fr_invwr, 0, sizeof(mw->fr_invwr));
		mw->fr_invwr.wr_id = (uintptr_t)mw;
		mw->fr_invwr.opcode = IB_WR_LOCAL_INV;
		mw->fr_invwr.ex.invalidate_rkey = mw->fr_mr->rkey;
		r_xprt->cqcount--;

		/* BUG: rdma-invalidation-leak -- the pages are unmapped while the server's rkey is still valid: the LOCAL_INV is only posted on the next line */
		ib_dma_unmap_sg(r_xprt->device, mw->fr_sg, mw->fr_nents,
				mw->fr_dir);

		rc = ib_post_send(r_xprt->qp, &mw->fr_invwr, NULL);
		if (rc)
			goto out_err;

		/* BUG: rdma-unmap-before-invalidate -- the MW goes back on the free list right after an unsignaled LOCAL_INV was posted, before it executed */
		xfr_put_mw(r_xprt, mw);
	}
	return;

out_err:
	pr_err("xfr: LOCAL_INV post failed (%d)\n", rc);
	xfr_defer_recovery(r_xprt, mw);
}

static void xfr_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_mw *mw = container_of(wc->wr_cqe, struct xfr_mw, fr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		mw->fr_state = FRMR_IS_STALE;
}

static void xfr_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_mw *mw = container_of(wc->wr_cqe, struct xfr_mw, fr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		mw->fr_state = FRMR_IS_STALE;
	complete(&mw->fr_linv_done);
}

/**
 * xfr_op_unmap_sync - invalidate the chunks of an RPC and wait for it
 * @r_xprt: the transport
 * @req: the RPC
 *
 * Used when the RPC consumer must not resume before the server lost
 * access to its memory (a retransmitted or interrupted RPC).
 */
void xfr_op_unmap_sync(struct xfr_xprt *r_xprt, struct xfr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct xfr_mw *mw, *tmp;
	int rc;

	list_for_each_entry(mw, &req->rl_registered, mw_list) {
		mw->fr_state = FRMR_IS_INVALID;

		memset(&mw->fr_invwr, 0, sizeof(mw->fr_invwr));
		mw->fr_cqe.done = xfr_wc_localinv;
		mw->fr_invwr.wr_cqe = &mw->fr_cqe;
		mw->fr_invwr.opcode = IB_WR_LOCAL_INV;
		mw->fr_invwr.ex.invalidate_rkey = mw->fr_mr->rkey;

		*prev = &mw->fr_invwr;
		prev = &mw->fr_invwr.next;
		last = &mw->fr_invwr;
	}
	if (!first)
		return;

	/* Strong send queue ordering guarantees that when the last
	 * WR in the chain completes, all WRs in the chain are complete.
	 */
	mw = container_of(last, struct xfr_mw, fr_invwr);
	mw->fr_cqe.done = xfr_wc_localinv_wake;
	last->send_flags = IB_SEND_SIGNALED;
	init_completion(&mw->fr_linv_done);

	rc = ib_post_send(r_xprt->qp, first, NULL);
	if (rc)
		goto reset_mws;

	wait_for_completion(&mw->fr_linv_done);

	list_for_each_entry_safe(mw, tmp, &req->rl_registered, mw_list) {
		list_del_init(&mw->mw_list);
		/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the chained LOCAL_INVs completed: the last one is signaled and waited for */
		ib_dma_unmap_sg(r_xprt->device, mw->fr_sg, mw->fr_nents,
				mw->fr_dir);
		xfr_put_mw(r_xprt, mw);
	}
	return;

reset_mws:
	/* Nothing was invalidated: leave the MWs to the connect worker. */
	pr_err("xfr: LOCAL_INV chain post failed (%d)\n", rc);
	list_for_each_entry_safe(mw, tmp, &req->rl_registered, mw_list) {
		list_del_init(&mw->mw_list);
		xfr_defer_recovery(r_xprt, mw);
	}
}
