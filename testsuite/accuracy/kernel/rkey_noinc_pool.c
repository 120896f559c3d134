// SPDX-License-Identifier: GPL-2.0
/*
 * dsm: page exposure of an invented distributed-shared-memory pager
 * ("dsm"). A node that owns a page lets a remote node fault it in with an
 * RDMA READ: the owner takes a pool MR, registers the page with REMOTE_READ
 * and sends (addr, rkey) in the fault reply; when the remote node
 * acknowledges, a signaled LOCAL_INV kills the key and its completion puts
 * the MR back in the pool.
 *
 * The bug: dsm_expose_page() registers the pooled MR without giving it a new
 * key. The MR was invalidated and returned by an earlier fault, so a node
 * that kept the previous rkey reads whichever page the MR now maps. The
 * batch path dsm_expose_range() rotates the key in dsm_next_key() first.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct dsm_node {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
};

struct dsm_fault_rep {
	__be64	addr;
	__be32	rkey;
	__be32	len;
};

struct dsm_exposure {
	struct dsm_node		*node;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*sgl;
	int			nents;
};

static void dsm_fill_rep(struct dsm_exposure *e, struct dsm_fault_rep *rep)
{
	rep->addr = cpu_to_be64(e->mr->iova);
	rep->rkey = cpu_to_be32(e->mr->rkey);
	rep->len = cpu_to_be32(e->mr->length);
}

static void dsm_next_key(struct ib_mr *mr)
{
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
}

int dsm_expose_page(struct dsm_exposure *e, struct dsm_fault_rep *rep)
{
	struct dsm_node *node = e->node;

	/* BUG: rdma-local-mr-management -- per-fault MR from the pager's own pool */
	e->mr = ib_mr_pool_get(node->qp, &node->qp->rdma_mrs);
	if (!e->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the pager maps the page into its MR */
	if (ib_map_mr_sg(e->mr, e->sgl, 1, NULL, SZ_4K) != 1) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(node->qp, &node->qp->rdma_mrs, e->mr); /* OK: rdma-mr-leak -- returned on the short map */
		e->mr = NULL;
		return -EINVAL;
	}

	memset(&e->reg_wr, 0, sizeof(e->reg_wr));
	e->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the pager */
	e->reg_wr.mr = e->mr; /* BUG: rdma-rkey-reuse -- a pooled, previously invalidated MR is registered again with its old key */
	e->reg_wr.key = e->mr->rkey;
	e->reg_wr.access = IB_ACCESS_REMOTE_READ; /* OK: rdma-access-flags-invalid -- REMOTE_READ alone needs no LOCAL_WRITE */
	dsm_fill_rep(e, rep);
	return ib_post_send(node->qp, &e->reg_wr.wr, NULL);
}

int dsm_expose_range(struct dsm_exposure *e, struct dsm_fault_rep *rep)
{
	struct dsm_node *node = e->node;
	int n;

	/* BUG: rdma-local-mr-management -- per-fault MR from the pager's own pool */
	e->mr = ib_mr_pool_get(node->qp, &node->qp->rdma_mrs);
	if (!e->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the pager maps the range into its MR */
	n = ib_map_mr_sg(e->mr, e->sgl, e->nents, NULL, SZ_4K);
	if (n != e->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(node->qp, &node->qp->rdma_mrs, e->mr); /* OK: rdma-mr-leak -- returned on the short map */
		e->mr = NULL;
		return -EINVAL;
	}

	dsm_next_key(e->mr);
	memset(&e->reg_wr, 0, sizeof(e->reg_wr));
	e->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the pager */
	e->reg_wr.mr = e->mr; /* OK: rdma-rkey-reuse -- dsm_next_key() rotated the key on the only path here */
	e->reg_wr.key = e->mr->rkey;
	e->reg_wr.access = IB_ACCESS_REMOTE_READ;
	dsm_fill_rep(e, rep);
	return ib_post_send(node->qp, &e->reg_wr.wr, NULL);
}

static void dsm_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct dsm_exposure *e = container_of(wc->wr_cqe, struct dsm_exposure,
					      inv_cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;	/* the node is fenced off; teardown destroys the pool */
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(e->node->qp, &e->node->qp->rdma_mrs, e->mr); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the LOCAL_INV's own completion */
	e->mr = NULL;
	ib_dma_unmap_sg(e->node->ibdev, e->sgl, e->nents, DMA_TO_DEVICE);
}

int dsm_fault_acked(struct dsm_exposure *e)
{
	e->inv_wr.opcode = IB_WR_LOCAL_INV;
	e->inv_wr.next = NULL;
	e->inv_wr.num_sge = 0;
	e->inv_wr.send_flags = IB_SEND_SIGNALED;
	e->inv_wr.ex.invalidate_rkey = e->mr->rkey;
	e->inv_cqe.done = dsm_inv_done;
	e->inv_wr.wr_cqe = &e->inv_cqe;
	return ib_post_send(e->node->qp, &e->inv_wr, NULL);
}
