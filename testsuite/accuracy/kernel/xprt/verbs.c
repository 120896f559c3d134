// SPDX-License-Identifier: GPL-2.0
/*
 * rdmx verbs.c: endpoint creation and the MR free list (see xprt_rdmx.h).
 *
 * The send queue is sized the way xprtrdma does it: a per-RPC depth counted
 * by hand (REG_MR and LOCAL_INV for the head, for each page-list chunk and
 * for the tail, plus the SEND), times the request count, plus the backchannel
 * and one entry for ib_drain_sq(); the request count is clamped so the
 * result fits max_qp_wr. It is enough; it is also exactly the hand-made
 * registration arithmetic that cap.max_rdma_ctxs moves into the core.
 */
#include "xprt_rdmx.h"

int rdmx_ep_create(struct rdmx_xprt *r_xprt, struct rdmx_ep *ep)
{
	struct ib_device *ibdev = ep->re_id->device;
	unsigned int depth, delta, max_qp_wr, send_wr;
	int ret;

	ep->re_max_fr_depth = min_t(unsigned int, RDMX_MAX_DATA_SEGS,
				    ibdev->attrs.max_fast_reg_page_list_len);
	ep->re_mrtype = IB_MR_TYPE_MEM_REG;
	if (ibdev->attrs.kernel_cap_flags & IBK_SG_GAPS_REG)
		ep->re_mrtype = IB_MR_TYPE_SG_GAPS;

	/* REG_MR + LOCAL_INV for head, page list and tail, plus the SEND */
	depth = 7;
	if (ep->re_max_fr_depth < RDMX_MAX_DATA_SEGS) {
		delta = RDMX_MAX_DATA_SEGS - ep->re_max_fr_depth;
		do {
			depth += 2;	/* FRWR reg + invalidate */
			delta -= min(delta, ep->re_max_fr_depth);
		} while (delta > 0);
	}

	max_qp_wr = ibdev->attrs.max_qp_wr - RDMX_BACKWARD_WRS - 1;
	if (ep->re_max_requests * depth > max_qp_wr)
		ep->re_max_requests = max_qp_wr / depth;
	if (!ep->re_max_requests)
		return -ENOMEM;
	send_wr = ep->re_max_requests * depth;

	memset(&ep->re_attr, 0, sizeof(ep->re_attr));
	ep->re_attr.qp_context = ep;
	ep->re_attr.srq = NULL;
	/* BUG: rdma-send-queue-manual-factor -- the request count times a hand-counted REG/INV depth per RPC */
	ep->re_attr.cap.max_send_wr = send_wr + RDMX_BACKWARD_WRS + 1; /* OK: rdma-send-queue-undersized, rdma-queue-cap-unchecked -- every WR an RPC can post is counted, one entry is left for the drain, and the total was clamped to max_qp_wr */
	ep->re_attr.cap.max_recv_wr = ep->re_max_requests + RDMX_BACKWARD_WRS + 1;
	/* OK: rdma-queue-cap-unchecked -- the SGE count is bounded by the device's max_send_sge */
	ep->re_attr.cap.max_send_sge = min_t(u32, RDMX_MAX_SEND_SGES,
					     ibdev->attrs.max_send_sge);
	ep->re_attr.cap.max_recv_sge = 1;
	ep->re_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- rdmx_frwr_send() signals every re_send_batch-th SEND and LOCAL_INV chains end signaled */
	ep->re_attr.qp_type = IB_QPT_RC;
	ep->re_send_batch = ep->re_max_requests >> 3;
	ep->re_send_count = ep->re_send_batch;

	ret = rdma_create_qp(ep->re_id, ep->re_pd, &ep->re_attr);
	if (ret)
		return ret;
	r_xprt->rx_ep = ep;
	return 0;
}

void rdmx_ep_destroy(struct rdmx_ep *ep)
{
	ib_drain_qp(ep->re_id->qp);
	rdma_destroy_qp(ep->re_id);
}

void rdmx_mr_put(struct rdmx_mr *mr)
{
	struct rdmx_xprt *r_xprt = mr->mr_xprt;

	if (mr->mr_dir != DMA_NONE) {
		ib_dma_unmap_sg(r_xprt->rx_device, mr->mr_sg, mr->mr_nents,
				mr->mr_dir);
		mr->mr_dir = DMA_NONE;
	}
	spin_lock(&r_xprt->rx_mr_lock);
	list_add(&mr->mr_list, &r_xprt->rx_mrs);
	spin_unlock(&r_xprt->rx_mr_lock);
}
