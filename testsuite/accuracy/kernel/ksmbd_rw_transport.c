// SPDX-License-Identifier: GPL-2.0
/*
 * smbs: QP setup and the RDMA read/write path of an SMB-Direct server
 * transport in the style of fs/smb/server/transport_rdma.c (written fresh).
 *
 * SMB2 READ and WRITE with RDMA channels are served with rdma_rw: the QP
 * declares max_rw_credits contexts, sized with rdma_rw_mr_factor(), and the
 * server's own send-queue entries are one SEND per send credit. The credit
 * target and the contexts are checked against the device's limits. But
 * teardown calls ib_drain_qp() and the send queue has no entry to spare for
 * it: with every credit in flight the drain cannot post its WR.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

struct smbs_transport {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct ib_qp		*qp;
	int			send_credit_target;
	int			recv_credit_max;
	int			max_rw_credits;
	int			max_rdma_rw_size;
	int			pages_per_rw_credit;
};

struct smbs_rw_msg {
	struct smbs_transport	*t;
	struct rdma_rw_ctx	rw_ctx;
	struct ib_cqe		cqe;
	struct scatterlist	*sgl;
	u32			nents;
	enum dma_data_direction	dir;
};

void smbs_rw_complete(struct smbs_rw_msg *msg, int status);

int smbs_create_qpair(struct smbs_transport *t)
{
	struct ib_device *dev = t->cm_id->device;
	struct ib_qp_init_attr qp_attr;
	int max_send_wrs, ret;

	t->pages_per_rw_credit = DIV_ROUND_UP(t->max_rdma_rw_size, PAGE_SIZE);
	t->max_rw_credits = DIV_ROUND_UP(t->max_rdma_rw_size,
					 t->pages_per_rw_credit * PAGE_SIZE);
	max_send_wrs = t->send_credit_target +
		       t->max_rw_credits *
		       rdma_rw_mr_factor(dev, t->cm_id->port_num,
					 t->pages_per_rw_credit);
	if (max_send_wrs > dev->attrs.max_cqe ||
	    max_send_wrs > dev->attrs.max_qp_wr) {
		pr_err("smbs: consider lowering send_credit_target = %d\n",
		       t->send_credit_target);
		return -EINVAL;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = t;
	qp_attr.send_cq = t->send_cq;
	qp_attr.recv_cq = t->recv_cq;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	/* BUG: rdma-send-queue-undersized -- one SEND per credit and no entry for the ib_drain_qp() in smbs_destroy_qpair() */
	qp_attr.cap.max_send_wr = t->send_credit_target; /* OK: rdma-send-queue-manual-factor -- no registration factor here; rdma_rw's share comes from max_rdma_ctxs */
	qp_attr.cap.max_recv_wr = t->recv_credit_max;
	qp_attr.cap.max_send_sge = 2;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.cap.max_inline_data = 0;
	qp_attr.cap.max_rdma_ctxs = t->max_rw_credits;
	qp_attr.port_num = t->cm_id->port_num;

	ret = rdma_create_qp(t->cm_id, t->pd, &qp_attr);
	if (ret)
		return ret;
	t->qp = t->cm_id->qp;
	return 0;
}

void smbs_destroy_qpair(struct smbs_transport *t)
{
	ib_drain_qp(t->qp);
	rdma_destroy_qp(t->cm_id);
}

static void smbs_rw_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbs_rw_msg *msg = container_of(wc->wr_cqe, struct smbs_rw_msg,
					       cqe);
	struct smbs_transport *t = msg->t;

	/* OK: rdma-invalidation-leak -- rdma_rw's MRs, released after the transfer completed */
	rdma_rw_ctx_destroy(&msg->rw_ctx, t->qp, t->cm_id->port_num,
			    msg->sgl, msg->nents, msg->dir);
	smbs_rw_complete(msg, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}

int smbs_rdma_rw(struct smbs_rw_msg *msg, u64 offset, u32 token, bool is_read)
{
	struct smbs_transport *t = msg->t;
	int ret;

	msg->dir = is_read ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	/* OK: rdma-local-mr-management, rdma-access-flags-transport -- the core registers the buffer and picks the READ sink's rights */
	ret = rdma_rw_ctx_init(&msg->rw_ctx, t->qp, t->cm_id->port_num,
			       msg->sgl, msg->nents, 0, offset, token, msg->dir);
	if (ret < 0)
		return ret;
	msg->cqe.done = smbs_rw_done;
	return rdma_rw_ctx_post(&msg->rw_ctx, t->qp, t->cm_id->port_num,
				&msg->cqe, NULL);
}

int smbs_post_send(struct smbs_transport *t, struct ib_send_wr *wr,
		   struct ib_cqe *cqe)
{
	wr->wr_cqe = cqe;
	wr->opcode = IB_WR_SEND;
	wr->send_flags = IB_SEND_SIGNALED;
	return ib_post_send(t->qp, wr, NULL);
}
