// SPDX-License-Identifier: GPL-2.0
/*
 * nbdx_io.c: request submission (see nbdx.h).
 *
 * A request takes an MR from the queue's free list; when the list is empty
 * (more than NBDX_NR_MRS requests in flight during a burst) it allocates an
 * "overflow" MR with ib_alloc_mr() on the submit path, which nbdx_cq.c
 * deregisters again on completion: a device command pair per I/O under
 * exactly the load where it hurts. The overflow MR also leaks when the
 * pages cannot be mapped into it. And the free-list MRs are registered
 * again without a new key.
 */
#include "nbdx.h"

void nbdx_put_mr(struct nbdx_queue *q, struct nbdx_mr *nmr)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	list_add_tail(&nmr->entry, &q->free_mrs);
	spin_unlock_irqrestore(&q->lock, flags);
}

static struct nbdx_mr *nbdx_get_mr(struct nbdx_queue *q)
{
	struct nbdx_mr *nmr;
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	nmr = list_first_entry_or_null(&q->free_mrs, struct nbdx_mr, entry);
	if (nmr)
		list_del(&nmr->entry);
	spin_unlock_irqrestore(&q->lock, flags);
	return nmr;
}

int nbdx_queue_rq(struct nbdx_req *req)
{
	struct nbdx_queue *q = req->q;
	struct nbdx_mr *nmr = nbdx_get_mr(q);
	struct ib_mr *mr;

	if (!nmr) {
		nmr = kzalloc(sizeof(*nmr), GFP_ATOMIC);
		if (!nmr)
			return -ENOMEM;
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- an MR allocated on the submit path whenever the free list runs dry */
		nmr->mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, NBDX_MAX_PAGES);
		if (IS_ERR(nmr->mr)) {
			kfree(nmr);
			return -ENOMEM;
		}
		nmr->overflow = true;
	}
	mr = nmr->mr;

	/* BUG: rdma-local-mr-management -- the driver maps pages into its MR */
	if (ib_map_mr_sg(mr, req->sgl, req->nents, NULL, SZ_4K) != req->nents) {
		if (!nmr->overflow)
			nbdx_put_mr(q, nmr);
		return -EINVAL; /* BUG: rdma-mr-leak -- an overflow MR is neither put back nor deregistered here */
	}

	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the driver */
	req->reg_wr.wr.next = &req->send_wr;
	req->reg_wr.mr = mr; /* BUG: rdma-rkey-reuse -- free-list MRs are registered again with the key of their previous request */
	req->reg_wr.key = mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			     IB_ACCESS_REMOTE_READ;
	put_unaligned_le32(mr->rkey, req->cmd);
	req->nmr = nmr;

	req->send_sge.addr = req->cmd_dma;
	req->send_sge.length = 32;
	req->send_sge.lkey = q->pd->local_dma_lkey;
	req->send_wr.next = NULL;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.send_flags = 0;
	return ib_post_send(q->cm_id->qp, &req->reg_wr.wr, NULL);
}
