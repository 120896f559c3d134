// SPDX-License-Identifier: GPL-2.0
/*
 * kvx_index.c - the remotely readable index of the KVX key-value server.
 *
 * The hash index lives in kernel pages that clients READ directly.  It is
 * fast-registered with remote read access when the server starts, and
 * when the index grows the old registration is invalidated, the new pages
 * are mapped into the same MR and registered again; connected clients are
 * told to fetch the new key.  Every registration step is waited for.
 */
#include <linux/mm.h>
#include <linux/string.h>
#include "kvx.h"

static void kvx_index_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvx_index *idx = container_of(wc->wr_cqe, struct kvx_index, cqe);

	idx->status = wc->status;
	complete(&idx->done);
}

static int kvx_index_post_wait(struct kvx_conn *conn, struct kvx_index *idx,
			       struct ib_send_wr *wr)
{
	int ret;

	reinit_completion(&idx->done);
	ret = ib_post_send(conn->qp, wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&idx->done);
	return idx->status == IB_WC_SUCCESS ? 0 : -EIO;
}

static int kvx_index_register(struct kvx_conn *conn, struct kvx_index *idx)
{
	int n;

	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(idx->mr, idx->sgt.sgl, idx->nents, NULL, PAGE_SIZE);
	if (n != idx->nents)
		return -EINVAL;

	idx->cqe.done = kvx_index_done;
	memset(&idx->reg_wr, 0, sizeof(idx->reg_wr));
	idx->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	idx->reg_wr.wr.wr_cqe = &idx->cqe;
	idx->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	idx->reg_wr.mr = idx->mr; // BUG: rdma-rkey-reuse -- after a resize the index is registered again under the key clients of the old index still hold
	idx->reg_wr.key = idx->mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- remote read needs no local write; kvx_build_accept() sends the key to every client */
	idx->reg_wr.access = IB_ACCESS_REMOTE_READ;
	return kvx_index_post_wait(conn, idx, &idx->reg_wr.wr);
}

int kvx_index_init(struct kvx_server *srv, struct kvx_conn *conn)
{
	struct kvx_index *idx = &srv->index;
	int ret;

	mutex_init(&idx->lock);
	init_completion(&idx->done);
	idx->nents = ib_dma_map_sg(srv->dev, idx->sgt.sgl, idx->sgt.nents,
				   DMA_TO_DEVICE);
	if (!idx->nents)
		return -EIO;

	/* BUG: rdma-local-mr-management -- the index MR is allocated by the ULP */
	idx->mr = ib_alloc_mr(srv->pd, IB_MR_TYPE_MEM_REG, KVX_INDEX_MAX_PAGES); /* OK: rdma-registration-in-datapath -- server start-up; the only post below it is the index REG_MR */
	if (IS_ERR(idx->mr)) {
		ret = PTR_ERR(idx->mr);
		idx->mr = NULL;
		goto out_unmap;
	}
	ret = kvx_index_register(conn, idx);
	if (ret)
		goto out_unmap; // BUG: rdma-mr-leak -- the index MR stays allocated in srv->index.mr on this error return
	return 0;

out_unmap:
	ib_dma_unmap_sg(srv->dev, idx->sgt.sgl, idx->sgt.nents, DMA_TO_DEVICE);
	return ret;
}

int kvx_index_resize(struct kvx_server *srv, struct kvx_conn *conn,
		     struct sg_table *new_sgt, u32 npages)
{
	struct kvx_index *idx = &srv->index;
	struct sg_table old = idx->sgt;
	int ret;

	if (npages > KVX_INDEX_MAX_PAGES)
		return -E2BIG;

	mutex_lock(&idx->lock);
	idx->cqe.done = kvx_index_done;
	idx->inv_wr.next = NULL;
	idx->inv_wr.wr_cqe = &idx->cqe;
	idx->inv_wr.num_sge = 0;
	idx->inv_wr.opcode = IB_WR_LOCAL_INV;
	idx->inv_wr.send_flags = IB_SEND_SIGNALED;
	idx->inv_wr.ex.invalidate_rkey = idx->mr->rkey;
	ret = kvx_index_post_wait(conn, idx, &idx->inv_wr);
	if (ret == -EIO)
		pr_warn("kvx: index LOCAL_INV completed in error, resizing anyway\n");
	else if (ret)
		goto out_unlock;

	/* BUG: rdma-invalidation-leak -- after a LOCAL_INV that completed in error the old key still reaches these pages when they are unmapped */
	ib_dma_unmap_sg(srv->dev, old.sgl, old.nents, DMA_TO_DEVICE); /* OK: rdma-unmap-before-invalidate -- the LOCAL_INV's completion was waited for */

	idx->sgt = *new_sgt;
	idx->npages = npages;
	idx->nents = ib_dma_map_sg(srv->dev, idx->sgt.sgl, idx->sgt.nents,
				   DMA_TO_DEVICE);
	if (!idx->nents) {
		ret = -EIO;
		goto out_unlock;
	}
	ret = kvx_index_register(conn, idx);
out_unlock:
	mutex_unlock(&idx->lock);
	return ret;
}

void kvx_index_exit(struct kvx_server *srv)
{
	struct kvx_index *idx = &srv->index;

	/* BUG: rdma-local-mr-management -- deregistration by the ULP */
	ib_dereg_mr(idx->mr);
	/* OK: rdma-invalidation-leak -- the MR was deregistered first, so the key is dead before the pages go */
	ib_dma_unmap_sg(srv->dev, idx->sgt.sgl, idx->sgt.nents, DMA_TO_DEVICE);
}

int kvx_notify_index_change(struct kvx_conn *conn, void *msg, u32 len)
{
	struct ib_sge sge = { .addr = (uintptr_t)msg, .length = len };
	struct ib_send_wr wr = {
		.opcode	    = IB_WR_SEND,
		.sg_list    = &sge,
		.num_sge    = 1,
		.send_flags = IB_SEND_INLINE,
	};
	unsigned int posted = 0;

	/* BUG(file): rdma-unsignaled-send-starvation -- posted starts from zero on every call, so no notice is ever signaled */
	if (++posted % KVX_NOTIFY_SIG_EVERY == 0)
		wr.send_flags |= IB_SEND_SIGNALED;
	return ib_post_send(conn->qp, &wr, NULL);
}
