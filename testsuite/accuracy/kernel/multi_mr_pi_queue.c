// SPDX-License-Identifier: GPL-2.0
/*
 * dif: an invented block initiator with end-to-end data integrity ("dif")
 * that sends protection information in a separate buffer: every WRITE with
 * PI registers two MRs (data and PI, each from its own pool), and the target
 * pulls both. When the response comes, both keys are invalidated locally.
 *
 * So one command can hold REG_MR x2, SEND and LOCAL_INV x2 = 5 send-queue
 * entries until their completions are reaped, but the queue was sized for the
 * single-MR case (3 per command, "MR, SEND, INV"), a hand-made factor that
 * did not follow the second MR. Under a full queue of PI writes the second
 * LOCAL_INV post fails. Device limits are respected: the SGE counts are
 * small constants and the depth is clamped to max_qp_wr.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define DIF_SEND_WR_FACTOR	3	/* MR, SEND, INV */
#define DIF_MAX_PAGES		64

struct dif_queue {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			queue_size;
	struct list_head	pi_mrs;
};

struct dif_cmd {
	struct dif_queue	*q;
	struct ib_mr		*data_mr;
	struct ib_mr		*pi_mr;
	struct ib_reg_wr	data_reg;
	struct ib_reg_wr	pi_reg;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	data_inv;
	struct ib_send_wr	pi_inv;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*data_sg;
	struct scatterlist	*pi_sg;
	int			data_nents;
	int			pi_nents;
	u8			wire_keys[8];
};

int dif_create_queue(struct dif_queue *q)
{
	struct ib_qp_init_attr attr = { };

	q->queue_size = min_t(u32, q->queue_size,
			      (q->ibdev->attrs.max_qp_wr - 1) / DIF_SEND_WR_FACTOR);
	attr.qp_context = q;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	/* BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a PI command posts two REG_MRs, a SEND and two LOCAL_INVs (5 WRs) against a hand-made factor of 3 */
	attr.cap.max_send_wr = DIF_SEND_WR_FACTOR * q->queue_size + 1; /* OK: rdma-queue-cap-unchecked -- the depth was clamped to max_qp_wr above */
	attr.cap.max_recv_wr = q->queue_size + 1;
	attr.cap.max_send_sge = 2;
	attr.cap.max_recv_sge = 1;

	q->qp = ib_create_qp(q->pd, &attr);
	if (IS_ERR(q->qp))
		return PTR_ERR(q->qp);

	/* BUG: rdma-local-mr-management -- the initiator keeps its own data MR pool */
	if (ib_mr_pool_init(q->qp, &q->qp->rdma_mrs, q->queue_size,
			    IB_MR_TYPE_MEM_REG, DIF_MAX_PAGES, 0))
		goto out_destroy_qp;
	/* BUG: rdma-local-mr-management -- and its own PI MR pool */
	if (ib_mr_pool_init(q->qp, &q->pi_mrs, q->queue_size,
			    IB_MR_TYPE_MEM_REG, 8, 0))
		goto out_destroy_pool;
	return 0;

out_destroy_pool:
	ib_mr_pool_destroy(q->qp, &q->qp->rdma_mrs);
out_destroy_qp:
	ib_destroy_qp(q->qp);
	return -ENOMEM;
}

void dif_destroy_queue(struct dif_queue *q)
{
	ib_drain_qp(q->qp);
	ib_mr_pool_destroy(q->qp, &q->pi_mrs);
	ib_mr_pool_destroy(q->qp, &q->qp->rdma_mrs);
	ib_destroy_qp(q->qp);
}

static void dif_build_reg(struct ib_reg_wr *reg, struct ib_mr *mr,
			  struct ib_send_wr *next)
{
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	memset(reg, 0, sizeof(*reg));
	reg->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the initiator */
	reg->wr.next = next;
	reg->mr = mr; /* OK: rdma-rkey-reuse -- rotated right above for both MRs */
	reg->key = mr->rkey;
	reg->access = IB_ACCESS_REMOTE_READ;
}

int dif_queue_write(struct dif_cmd *c)
{
	struct dif_queue *q = c->q;

	/* BUG: rdma-local-mr-management -- per-command data MR from the pool */
	c->data_mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	/* BUG: rdma-local-mr-management -- per-command PI MR from the pool */
	c->pi_mr = ib_mr_pool_get(q->qp, &q->pi_mrs);
	if (!c->data_mr || !c->pi_mr)
		goto out_put;

	/* BUG: rdma-local-mr-management -- the initiator maps data into its MR */
	if (ib_map_mr_sg(c->data_mr, c->data_sg, c->data_nents, NULL, SZ_4K) !=
	    c->data_nents)
		goto out_put;
	/* BUG: rdma-local-mr-management -- the initiator maps PI into its MR */
	if (ib_map_mr_sg(c->pi_mr, c->pi_sg, c->pi_nents, NULL, SZ_4K) !=
	    c->pi_nents)
		goto out_put;

	dif_build_reg(&c->data_reg, c->data_mr, &c->pi_reg.wr);
	dif_build_reg(&c->pi_reg, c->pi_mr, &c->send_wr);
	put_unaligned_le32(c->data_mr->rkey, c->wire_keys);
	put_unaligned_le32(c->pi_mr->rkey, c->wire_keys + 4);
	c->send_wr.opcode = IB_WR_SEND;
	c->send_wr.send_flags = IB_SEND_SIGNALED;
	c->send_wr.next = NULL;
	return ib_post_send(q->qp, &c->data_reg.wr, NULL);

out_put:
	if (c->pi_mr)
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(q->qp, &q->pi_mrs, c->pi_mr);
	if (c->data_mr)
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, c->data_mr); /* OK: rdma-mr-leak -- both MRs are put back on every failure */
	c->pi_mr = c->data_mr = NULL;
	return -EAGAIN;
}

int dif_rsp_received(struct dif_cmd *c)
{
	c->data_inv.opcode = IB_WR_LOCAL_INV;
	c->data_inv.num_sge = 0;
	c->data_inv.send_flags = 0;
	c->data_inv.ex.invalidate_rkey = c->data_mr->rkey;
	c->data_inv.next = &c->pi_inv;
	c->pi_inv.opcode = IB_WR_LOCAL_INV;
	c->pi_inv.num_sge = 0;
	c->pi_inv.send_flags = IB_SEND_SIGNALED;
	c->pi_inv.ex.invalidate_rkey = c->pi_mr->rkey;
	c->pi_inv.wr_cqe = &c->inv_cqe;
	c->pi_inv.next = NULL;
	return ib_post_send(c->q->qp, &c->data_inv, NULL);
}
