// SPDX-License-Identifier: GPL-2.0
/*
 * pxi: queue setup and teardown of an invented PCIe-extension-over-RDMA
 * initiator ("pxi") whose transactions are fast-registered, sent, and
 * invalidated locally when the completion arrives (the target never uses
 * SEND_WITH_INV).
 *
 * The send queue reserves exactly REG_MR + SEND + LOCAL_INV per outstanding
 * transaction (3 * depth), which covers the I/O but leaves no entry for the
 * ib_drain_qp() that teardown posts: with a full queue the drain WR cannot
 * be posted and teardown hangs. The factor is also the hand-made
 * registration arithmetic. Signaling is per request and correct.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define PXI_WRS_PER_TXN	3	/* REG_MR, SEND, LOCAL_INV */
#define PXI_MAX_PAGES	32

struct pxi_queue {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			depth;
};

struct pxi_txn {
	struct pxi_queue	*q;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	inv_wr;
	struct ib_sge		sge;
	struct ib_cqe		send_cqe;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*sgl;
	int			nents;
	u8			*hdr;
	u64			hdr_dma;
};

void pxi_txn_complete(struct pxi_txn *t, int status);

int pxi_create_queue(struct pxi_queue *q)
{
	struct ib_qp_init_attr attr = { };
	int ret;

	attr.qp_context = q;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- SENDs and LOCAL_INVs are signaled */
	/* BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- exactly three WRs per transaction and none left for the ib_drain_qp() in pxi_destroy_queue(); the factor is the hand-made registration arithmetic */
	attr.cap.max_send_wr = PXI_WRS_PER_TXN * q->depth;
	attr.cap.max_recv_wr = q->depth + 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;

	q->qp = ib_create_qp(q->pd, &attr);
	if (IS_ERR(q->qp))
		return PTR_ERR(q->qp);

	/* BUG: rdma-local-mr-management -- the initiator keeps its own MR pool */
	ret = ib_mr_pool_init(q->qp, &q->qp->rdma_mrs, q->depth,
			      IB_MR_TYPE_MEM_REG, PXI_MAX_PAGES, 0);
	if (ret)
		ib_destroy_qp(q->qp);
	return ret;
}

void pxi_destroy_queue(struct pxi_queue *q)
{
	ib_drain_qp(q->qp);
	ib_mr_pool_destroy(q->qp, &q->qp->rdma_mrs);
	ib_destroy_qp(q->qp);
}

static void pxi_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("pxi: send failed: %s\n", ib_wc_status_msg(wc->status));
}

int pxi_submit(struct pxi_txn *t)
{
	struct pxi_queue *q = t->q;

	/* BUG: rdma-local-mr-management -- per-transaction MR from the initiator's own pool */
	t->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!t->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the initiator maps pages into its MR */
	if (ib_map_mr_sg(t->mr, t->sgl, t->nents, NULL, SZ_4K) != t->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, t->mr);
		t->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(t->mr, ib_inc_rkey(t->mr->rkey));

	memset(&t->reg_wr, 0, sizeof(t->reg_wr));
	t->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the initiator */
	t->reg_wr.wr.next = &t->send_wr;
	t->reg_wr.mr = t->mr;
	t->reg_wr.key = t->mr->rkey;
	t->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			   IB_ACCESS_REMOTE_READ;

	t->sge.addr = t->hdr_dma;
	t->sge.length = 32;
	t->sge.lkey = q->pd->local_dma_lkey;
	t->send_cqe.done = pxi_send_done;
	t->send_wr.next = NULL;
	t->send_wr.wr_cqe = &t->send_cqe;
	t->send_wr.opcode = IB_WR_SEND;
	t->send_wr.sg_list = &t->sge;
	t->send_wr.num_sge = 1;
	t->send_wr.send_flags = IB_SEND_SIGNALED;
	/* the target learns address and key from the header */
	put_unaligned_le64(t->mr->iova, t->hdr);
	put_unaligned_le32(t->mr->rkey, t->hdr + 8);
	return ib_post_send(q->qp, &t->reg_wr.wr, NULL);
}

static void pxi_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct pxi_txn *t = container_of(wc->wr_cqe, struct pxi_txn, inv_cqe);
	struct pxi_queue *q = t->q;

	if (wc->status != IB_WC_SUCCESS)
		return;	/* flushed: the queue is going away */
	ib_dma_unmap_sg(q->ibdev, t->sgl, t->nents, DMA_BIDIRECTIONAL);
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, t->mr); /* OK: rdma-invalidation-leak -- released from the LOCAL_INV's completion */
	t->mr = NULL;
	pxi_txn_complete(t, 0);
}

void pxi_rsp_received(struct pxi_txn *t)
{
	t->inv_wr.opcode = IB_WR_LOCAL_INV;
	t->inv_wr.next = NULL;
	t->inv_wr.num_sge = 0;
	t->inv_wr.send_flags = IB_SEND_SIGNALED;
	t->inv_wr.ex.invalidate_rkey = t->mr->rkey;
	t->inv_cqe.done = pxi_inv_done;
	t->inv_wr.wr_cqe = &t->inv_cqe;
	if (ib_post_send(t->q->qp, &t->inv_wr, NULL))
		pr_err("pxi: LOCAL_INV post failed\n");
}
