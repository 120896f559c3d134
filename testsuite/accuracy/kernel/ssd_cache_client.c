// SPDX-License-Identifier: GPL-2.0
/*
 * ssc: the cache-line registration of an invented remote flash cache client
 * ("ssc"). Dirty lines are registered for the cache server to RDMA READ
 * (write-back) and clean-miss lines for it to RDMA WRITE (fill); the key
 * goes to the server in the request.
 *
 * Three bugs in otherwise ordinary code: the fill branch grants REMOTE_WRITE
 * without LOCAL_WRITE; pooled MRs are registered without a new key; and
 * eviction posts an unsignaled LOCAL_INV and returns the MR to the pool in
 * the next statement. The normal completion path invalidates with a
 * signaled LOCAL_INV and releases from its completion.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct ssc_conn {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
};

struct ssc_line {
	struct ssc_conn		*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*sgl;
	int			nents;
	bool			dirty;
	u8			key[4];
};

int ssc_map_line(struct ssc_line *l)
{
	struct ssc_conn *c = l->conn;

	/* BUG: rdma-local-mr-management -- per-line MR from the client's own pool */
	l->mr = ib_mr_pool_get(c->qp, &c->qp->rdma_mrs);
	if (!l->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the client maps the line into its MR */
	if (ib_map_mr_sg(l->mr, l->sgl, l->nents, NULL, SZ_4K) != l->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, l->mr);
		l->mr = NULL;
		return -EINVAL;
	}
	memset(&l->reg_wr, 0, sizeof(l->reg_wr));
	l->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	l->reg_wr.mr = l->mr; /* BUG: rdma-rkey-reuse -- pooled MRs come back and are registered with their old key */
	l->reg_wr.key = l->mr->rkey;
	/* BUG: rdma-access-flags-invalid -- the fill branch has REMOTE_WRITE without LOCAL_WRITE */
	l->reg_wr.access = l->dirty ? IB_ACCESS_REMOTE_READ :
				      IB_ACCESS_REMOTE_WRITE;
	put_unaligned_le32(l->mr->rkey, l->key);
	return ib_post_send(c->qp, &l->reg_wr.wr, NULL);
}

static void ssc_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct ssc_line *l = container_of(wc->wr_cqe, struct ssc_line, inv_cqe);
	struct ssc_conn *c = l->conn;

	if (wc->status != IB_WC_SUCCESS)
		return;
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, l->mr); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- released from the completion of its signaled LOCAL_INV */
	l->mr = NULL;
	ib_dma_unmap_sg(c->ibdev, l->sgl, l->nents, DMA_BIDIRECTIONAL);
}

int ssc_line_done(struct ssc_line *l)
{
	l->inv_wr.opcode = IB_WR_LOCAL_INV;
	l->inv_wr.next = NULL;
	l->inv_wr.num_sge = 0;
	l->inv_wr.send_flags = IB_SEND_SIGNALED;
	l->inv_wr.ex.invalidate_rkey = l->mr->rkey;
	l->inv_cqe.done = ssc_inv_done;
	l->inv_wr.wr_cqe = &l->inv_cqe;
	return ib_post_send(l->conn->qp, &l->inv_wr, NULL);
}

void ssc_evict_line(struct ssc_line *l)
{
	struct ssc_conn *c = l->conn;

	l->inv_wr.opcode = IB_WR_LOCAL_INV;
	l->inv_wr.next = NULL;
	l->inv_wr.num_sge = 0;
	l->inv_wr.send_flags = 0;
	l->inv_wr.ex.invalidate_rkey = l->mr->rkey;
	if (ib_post_send(c->qp, &l->inv_wr, NULL))
		return;		/* the connection is being reset */
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, l->mr); /* BUG: rdma-unmap-before-invalidate -- the MR is recycled right after an unsignaled LOCAL_INV */
	l->mr = NULL;
	ib_dma_unmap_sg(c->ibdev, l->sgl, l->nents, DMA_BIDIRECTIONAL);
}
