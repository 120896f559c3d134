// SPDX-License-Identifier: GPL-2.0
/*
 * rdx: the release paths of an invented replicated-dataset exporter ("rdx")
 * whose requests each own a pool MR registered for a remote reader. Every
 * path posts a LOCAL_INV for the request's key; what differs is when the
 * memory or the MR is let go:
 *
 *   - rdx_abort() posts it unsignaled and frees the data buffer at once;
 *   - rdx_recycle() posts it unsignaled and puts the request (and its MR)
 *     back on the free list at once;
 *   - rdx_release_sync() signals it and waits, but with a timeout, and
 *     unmaps on the timeout path too;
 *   - rdx_close() posts one per MR and deregisters the MRs at once, while the
 *     LOCAL_INVs still reference them;
 *   - rdx_close_drained() posts them, drains the send queue (every posted WR
 *     has completed when ib_drain_sq() returns) and only then deregisters.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <rdma/ib_verbs.h>

#define RDX_NR_REQS	32

struct rdx_queue {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct list_head	free_list;
};

struct rdx_req {
	struct rdx_queue	*q;
	struct ib_mr		*mr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	struct list_head	entry;
	void			*buf;
	struct scatterlist	sg;
};

static void rdx_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdx_req *req = container_of(wc->wr_cqe, struct rdx_req, inv_cqe);

	complete(&req->inv_done);
}

static int rdx_post_inv(struct rdx_req *req, bool signaled)
{
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.next = NULL;
	req->inv_wr.num_sge = 0;
	req->inv_wr.send_flags = signaled ? IB_SEND_SIGNALED : 0;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	req->inv_cqe.done = rdx_inv_done;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	init_completion(&req->inv_done);
	return ib_post_send(req->q->qp, &req->inv_wr, NULL);
}

void rdx_abort(struct rdx_req *req)
{
	if (rdx_post_inv(req, false))
		return;		/* the connection is dead; teardown frees it */
	ib_dma_unmap_sg(req->q->ibdev, &req->sg, 1, DMA_TO_DEVICE); /* BUG: rdma-unmap-before-invalidate -- unmapped right after an unsignaled LOCAL_INV */
	kfree(req->buf);
	req->buf = NULL;
}

void rdx_recycle(struct rdx_req *req)
{
	if (rdx_post_inv(req, false))
		return;
	/* BUG: rdma-unmap-before-invalidate -- the request and its MR go back on the free list before the LOCAL_INV has run */
	list_add_tail(&req->entry, &req->q->free_list);
}

int rdx_release_sync(struct rdx_req *req)
{
	int ret = rdx_post_inv(req, true);

	if (ret)
		return ret;
	if (!wait_for_completion_timeout(&req->inv_done, msecs_to_jiffies(100)))
		pr_warn("rdx: LOCAL_INV of %#x is slow\n", req->mr->rkey);
	/* BUG: rdma-unmap-before-invalidate -- when the wait times out the pages are unmapped anyway, before the LOCAL_INV completed */
	ib_dma_unmap_sg(req->q->ibdev, &req->sg, 1, DMA_TO_DEVICE);
	list_add_tail(&req->entry, &req->q->free_list);
	return 0;
}

void rdx_close(struct rdx_queue *q, struct rdx_req *reqs)
{
	int i;

	for (i = 0; i < RDX_NR_REQS; i++)
		rdx_post_inv(&reqs[i], false);
	for (i = 0; i < RDX_NR_REQS; i++)
		/* BUG: rdma-local-mr-management -- the exporter deregisters its MRs */
		ib_dereg_mr(reqs[i].mr); /* BUG: rdma-unmap-before-invalidate -- the MRs are deregistered while their LOCAL_INVs may still be queued */
}

void rdx_close_drained(struct rdx_queue *q, struct rdx_req *reqs)
{
	int i;

	for (i = 0; i < RDX_NR_REQS; i++)
		rdx_post_inv(&reqs[i], false);
	ib_drain_sq(q->qp);
	for (i = 0; i < RDX_NR_REQS; i++)
		/* BUG: rdma-local-mr-management -- the exporter deregisters its MRs */
		ib_dereg_mr(reqs[i].mr); /* OK: rdma-unmap-before-invalidate -- ib_drain_sq() returned, so every posted LOCAL_INV has completed */
}
