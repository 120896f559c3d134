// RUN: %check_ulplint --kernel %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t.plugin

// An initiator with a pool of fast-registration descriptors (the SRP
// shape): a request holds an array of descriptor pointers, a helper posts
// the LOCAL_INV of a key it gets as an integer, another puts a whole array
// of descriptors back on the pool's free list.

#include <linux/list.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>

struct dsi_completion { int done; };
void wait_for_completion(struct dsi_completion *c);

struct dsi_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
};

struct dsi_pool {
	spinlock_t		lock;
	struct list_head	free_list;
};

struct dsi_cmd {
	struct scatterlist	*sg;
	int			nents;
};

static inline struct scatterlist *dsi_cmd_sg(struct dsi_cmd *c) { return c->sg; }

struct dsi_req {
	struct dsi_cmd		*cmd;
	struct dsi_desc		**descs;
	int			ndesc;
	struct ib_cqe		cqe;
	struct dsi_completion	inv_done;
	struct scatterlist	*sg;
	int			nents;
};

struct dsi_chan {
	struct ib_device	*dev;
	struct ib_qp		*qp;
	struct dsi_pool		*pool;
	struct work_struct	reset_work;
};

static struct dsi_desc *dsi_pool_get(struct dsi_pool *pool)
{
	struct dsi_desc *d = NULL;

	spin_lock(&pool->lock);
	if (!list_empty(&pool->free_list)) {
		d = list_first_entry(&pool->free_list, struct dsi_desc, entry);
		list_del(&d->entry);
	}
	spin_unlock(&pool->lock);
	return d;
}

static void dsi_pool_put(struct dsi_pool *pool, struct dsi_desc **d, int n)
{
	int i;

	spin_lock(&pool->lock);
	for (i = 0; i < n; i++)
		list_add(&d[i]->entry, &pool->free_list);
	spin_unlock(&pool->lock);
}

/* Registers up to n descriptors for the request, one REG_MR each. */
int dsi_map(struct dsi_chan *ch, struct dsi_req *req, int n)
{
	struct ib_reg_wr wr;
	struct dsi_desc *d;
	int i, ret;

	for (i = 0; i < n; i++) {
		d = dsi_pool_get(ch->pool);
		if (!d)
			return -ENOMEM;
		ib_update_fast_reg_key(d->mr, ib_inc_rkey(d->mr->rkey));
		/* Near miss: a descriptor fresh from the pool goes back when it
		 * cannot be mapped; the REG_MR of the previous round was for
		 * another descriptor. */
		if (ib_map_mr_sg(d->mr, req->sg, req->nents, NULL, SZ_4K) < 0) {
			dsi_pool_put(ch->pool, &d, 1);
			return -EIO;
		}
		wr.wr.next = NULL;
		wr.wr.opcode = IB_WR_REG_MR;
		wr.wr.wr_cqe = &req->cqe;
		wr.wr.num_sge = 0;
		wr.wr.send_flags = 0;
		wr.mr = d->mr;
		wr.key = d->mr->rkey;
		wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			    IB_ACCESS_REMOTE_WRITE;
		req->descs[req->ndesc++] = d;
		ret = ib_post_send(ch->qp, &wr.wr, NULL);
		if (ret)
			return ret;
	}
	return 0;
}

static int dsi_inv_key(struct dsi_chan *ch, struct dsi_req *req, u32 rkey,
		       bool signaled)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.ex.invalidate_rkey = rkey,
	};

	wr.send_flags = signaled ? IB_SEND_SIGNALED : 0;
	wr.wr_cqe = &req->cqe;
	return ib_post_send(ch->qp, &wr, NULL);
}

/* The descriptors go back to the pool while their unsignaled LOCAL_INVs
 * may still be queued, and with a valid key when a post failed. */
void dsi_unmap(struct dsi_chan *ch, struct dsi_req *req)
{
	struct dsi_desc **d;
	int i;

	for (i = req->ndesc, d = req->descs; i > 0; i--, d++)
		if (dsi_inv_key(ch, req, (*d)->mr->rkey, false) < 0)
			queue_work(system_wq, &ch->reset_work);
	if (req->ndesc)
		dsi_pool_put(ch->pool, req->descs, req->ndesc);
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'dsi_pool_put' recycles the request that holds a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	// CHECK-MESSAGES: :[[@LINE-2]]:3: warning: 'dsi_pool_put' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
	req->ndesc = 0;
	ib_dma_unmap_sg(ch->dev, dsi_cmd_sg(req->cmd), req->cmd->nents, DMA_BIDIRECTIONAL);
}

/* Near miss: signaled LOCAL_INVs waited for; a failed post resets the
 * channel and keeps the descriptors out of the pool. */
void dsi_unmap_wait(struct dsi_chan *ch, struct dsi_req *req)
{
	struct dsi_desc **d;
	int i;

	for (i = req->ndesc, d = req->descs; i > 0; i--, d++)
		if (dsi_inv_key(ch, req, (*d)->mr->rkey, true) < 0) {
			queue_work(system_wq, &ch->reset_work);
			return;
		}
	wait_for_completion(&req->inv_done);
	if (req->ndesc)
		dsi_pool_put(ch->pool, req->descs, req->ndesc);
	req->ndesc = 0;
	ib_dma_unmap_sg(ch->dev, dsi_cmd_sg(req->cmd), req->cmd->nents, DMA_BIDIRECTIONAL);
}
