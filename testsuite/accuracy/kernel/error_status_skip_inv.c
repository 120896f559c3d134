// SPDX-License-Identifier: GPL-2.0
/*
 * spr: the completion handler of an invented shuffle-partition exchange
 * ("spr") used by a distributed query engine. A consumer registers a receive
 * partition for a producer to RDMA WRITE into, announces it, and gets a
 * "partition done" message with a status.
 *
 * On a good status the consumer posts a signaled LOCAL_INV and recycles the
 * partition from its completion. On a failed partition (the producer
 * reported an error, the QP is still fine) it skips the invalidation "since
 * the data is garbage anyway" and puts the partition straight back on the
 * free list: the producer's key still works and the next partition that
 * reuses the buffer can be overwritten. The flush path (the QP is in error
 * and about to be destroyed together with the MRs) is different: there the
 * MR is deregistered before the partition is freed.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <rdma/ib_verbs.h>

struct spr_conn {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	spinlock_t		lock;
	struct list_head	free_parts;
};

struct spr_part {
	struct spr_conn		*conn;
	struct ib_mr		*mr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct list_head	entry;
	struct scatterlist	*sgl;
	int			nents;
};

static void spr_recycle(struct spr_part *p)
{
	struct spr_conn *c = p->conn;
	unsigned long flags;

	ib_dma_unmap_sg(c->ibdev, p->sgl, p->nents, DMA_FROM_DEVICE);
	spin_lock_irqsave(&c->lock, flags);
	list_add_tail(&p->entry, &c->free_parts);
	spin_unlock_irqrestore(&c->lock, flags);
}

static void spr_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct spr_part *p = container_of(wc->wr_cqe, struct spr_part, inv_cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;		/* flushed; spr_flush_part() handles it */
	spr_recycle(p); /* OK: rdma-invalidation-leak -- the LOCAL_INV of this partition's key has completed */
}

void spr_part_done(struct spr_part *p, int status)
{
	struct spr_conn *c = p->conn;

	if (status) {
		pr_warn("spr: producer failed partition: %d\n", status);
		spr_recycle(p); /* BUG: rdma-invalidation-leak -- a failed partition is recycled without invalidating the producer's rkey */
		return;
	}

	p->inv_wr.opcode = IB_WR_LOCAL_INV;
	p->inv_wr.next = NULL;
	p->inv_wr.num_sge = 0;
	p->inv_wr.send_flags = IB_SEND_SIGNALED;
	p->inv_wr.ex.invalidate_rkey = p->mr->rkey;
	p->inv_cqe.done = spr_inv_done;
	p->inv_wr.wr_cqe = &p->inv_cqe;
	if (ib_post_send(c->qp, &p->inv_wr, NULL))
		pr_err("spr: LOCAL_INV post failed\n");
}

void spr_flush_part(struct spr_part *p)
{
	/* BUG: rdma-local-mr-management -- the engine deregisters its MR */
	ib_dereg_mr(p->mr); /* OK: rdma-invalidation-leak -- deregistration kills the key before the memory is released */
	p->mr = NULL;
	ib_dma_unmap_sg(p->conn->ibdev, p->sgl, p->nents, DMA_FROM_DEVICE);
	kfree(p);
}
