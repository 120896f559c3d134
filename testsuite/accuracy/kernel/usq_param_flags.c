// SPDX-License-Identifier: GPL-2.0
/*
 * bcs: the broadcast sender of an invented cluster-membership service
 * ("bcs"). All posts go through bcs_post(), whose send flags come from the
 * caller, and the QP only generates requested completions.
 *
 * Every caller passes 0 or IB_SEND_SOLICITED, never IB_SEND_SIGNALED, so no
 * work request is ever signaled and the send queue fills after max_send_wr
 * messages. The doc's "What is reported" evaluates send_flags at each post;
 * here the value arrives as a parameter whose every caller passes a
 * constant without SIGNALED, which by the check's purpose is the same bug
 * (the doc's limitations say caller-supplied flags are assumed to signal).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

struct bcs_node {
	struct ib_pd	*pd;
	struct ib_cq	*cq;
	struct ib_qp	*qp;
	u32		depth;
};

int bcs_create_qp(struct bcs_node *n)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = n->cq;
	attr.recv_cq = n->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* BUG(file): rdma-unsignaled-send-starvation -- no caller of bcs_post() ever asks for IB_SEND_SIGNALED */
	attr.cap.max_send_wr = n->depth;
	attr.cap.max_recv_wr = n->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	n->qp = ib_create_qp(n->pd, &attr);
	if (IS_ERR(n->qp))
		return PTR_ERR(n->qp);
	return 0;
}

static int bcs_post(struct bcs_node *n, u64 dma, u32 len, int flags)
{
	struct ib_sge sge = {
		.addr = dma,
		.length = len,
		.lkey = n->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.opcode = IB_WR_SEND,
		.sg_list = &sge,
		.num_sge = 1,
		.send_flags = flags,
	};

	return ib_post_send(n->qp, &wr, NULL);
}

int bcs_heartbeat(struct bcs_node *n, u64 dma)
{
	return bcs_post(n, dma, 16, 0);
}

int bcs_view_change(struct bcs_node *n, u64 dma, u32 len)
{
	return bcs_post(n, dma, len, IB_SEND_SOLICITED);
}

int bcs_leave(struct bcs_node *n, u64 dma)
{
	return bcs_post(n, dma, 16, IB_SEND_SOLICITED);
}

struct bcs_rx {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	u64			dma;
	struct bcs_node		*node;
};

void bcs_deliver(struct bcs_node *n, struct bcs_rx *rx, u32 len);

static void bcs_rx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct bcs_rx *rx = container_of(wc->wr_cqe, struct bcs_rx, cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	bcs_deliver(rx->node, rx, wc->byte_len);
	ib_post_recv(rx->node->qp, &rx->wr, NULL);
}

int bcs_post_rx(struct bcs_node *n, struct bcs_rx *rx)
{
	rx->node = n;
	rx->cqe.done = bcs_rx_done;
	rx->sge.addr = rx->dma;
	rx->sge.length = 256;
	rx->sge.lkey = n->pd->local_dma_lkey;
	rx->wr.next = NULL;
	rx->wr.wr_cqe = &rx->cqe;
	rx->wr.sg_list = &rx->sge;
	rx->wr.num_sge = 1;
	return ib_post_recv(n->qp, &rx->wr, NULL);
}
