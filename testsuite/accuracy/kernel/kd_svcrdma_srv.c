// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0
/*
 * kd_svcrdma_srv.c - NFS/RDMA server transport (RPC-over-RDMA v1), modelled
 * on net/sunrpc/xprtrdma/svc_rdma_*.c.
 *
 * One receive context per posted Receive, one send context per Reply with
 * an SGE array (transport header + page list), rdma_rw contexts for the
 * client's Read chunks (pull) and Write chunks (push).  Replies go out as
 * SEND_WITH_INV when the client registered exactly one rkey for the call.
 *
 * Correct: the rdma_rw contexts (the core owns and lazily invalidates their
 * MRs), every Reply is signaled, max_inline_data is read back after the QP
 * is created, the iWARP test only sizes the rw context count.
 * Not correct: neither queue has a slot left for ib_drain_qp(); the send
 * SGE count is never compared with the device's limit; the "trusted fabric"
 * knob hands out the PD's global rkey; the small-Read-chunk fast path pulls
 * into local_dma_lkey memory, which iWARP devices cannot use as a READ sink.
 */
#include <linux/types.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define KD_SVC_MAXPAGES		260
#define KD_SVC_MAX_SEND_SGES	16	/* transport header + 15 pages */
#define KD_SVC_RECV_SIZE	4096
#define KD_SVC_INLINE_MAX	128
#define KD_SVC_RW_SGES		32
#define KD_SVC_SMALL_READ	1024

static unsigned int kd_svc_max_requests = 64;
module_param(kd_svc_max_requests, uint, 0644);

static bool kd_svc_trusted_fabric;
module_param(kd_svc_trusted_fabric, bool, 0444);

struct kd_svc_xprt {
	struct rdma_cm_id	*sc_cm_id;
	struct ib_device	*sc_dev;
	struct ib_pd		*sc_pd;
	struct ib_cq		*sc_sq_cq;
	struct ib_cq		*sc_rq_cq;
	struct ib_qp		*sc_qp;
	u32			 sc_port_num;
	unsigned int		 sc_max_requests;
	unsigned int		 sc_max_inline;
	bool			 sc_snd_w_inv;
	atomic_t		 sc_sq_avail;
	wait_queue_head_t	 sc_send_wait;
	spinlock_t		 sc_send_lock;
	struct list_head	 sc_send_ctxts;
	struct list_head	 sc_recv_ctxts;
};

struct kd_svc_recv_ctxt {
	struct list_head	 rc_list;
	struct kd_svc_xprt	*rc_xprt;
	struct ib_recv_wr	 rc_recv_wr;
	struct ib_cqe		 rc_cqe;
	struct ib_sge		 rc_recv_sge;
	void			*rc_recv_buf;
	u32			 rc_inv_rkey;	/* 0: client used several rkeys */
	u64			 rc_read_addr;
	u32			 rc_read_rkey;
	u32			 rc_read_len;
};

struct kd_svc_rw_ctxt {
	struct rdma_rw_ctx	 rw_ctx;
	struct ib_cqe		 rw_cqe;
	struct completion	 rw_done;
	int			 rw_status;
	unsigned int		 rw_nents;
	struct scatterlist	 rw_sg[KD_SVC_RW_SGES];
};

struct kd_svc_send_ctxt {
	struct list_head	 sc_list;
	struct kd_svc_xprt	*sc_xprt;
	struct kd_svc_rw_ctxt	*sc_write_rw;	/* Write chunk chained before us */
	struct ib_send_wr	 sc_send_wr;
	struct ib_cqe		 sc_cqe;
	unsigned int		 sc_cur_sge_no;
	struct ib_sge		 sc_sges[KD_SVC_MAX_SEND_SGES];
};

void kd_svc_wc_receive(struct ib_cq *cq, struct ib_wc *wc);
void kd_svc_xprt_deferred_close(struct kd_svc_xprt *rdma);

static int kd_svc_post_recvs(struct kd_svc_xprt *rdma)
{
	struct kd_svc_recv_ctxt *ctxt;
	unsigned int i;

	for (i = 0; i < rdma->sc_max_requests; i++) {
		ctxt = kzalloc(sizeof(*ctxt) + KD_SVC_RECV_SIZE, GFP_KERNEL);
		if (!ctxt)
			return -ENOMEM;
		ctxt->rc_xprt = rdma;
		ctxt->rc_recv_buf = ctxt + 1;
		ctxt->rc_cqe.done = kd_svc_wc_receive;
		ctxt->rc_recv_sge.addr = ib_dma_map_single(rdma->sc_dev,
				ctxt->rc_recv_buf, KD_SVC_RECV_SIZE,
				DMA_FROM_DEVICE);
		ctxt->rc_recv_sge.length = KD_SVC_RECV_SIZE;
		ctxt->rc_recv_sge.lkey = rdma->sc_pd->local_dma_lkey;
		ctxt->rc_recv_wr.wr_cqe = &ctxt->rc_cqe;
		ctxt->rc_recv_wr.sg_list = &ctxt->rc_recv_sge;
		ctxt->rc_recv_wr.num_sge = 1;
		list_add(&ctxt->rc_list, &rdma->sc_recv_ctxts);
		if (ib_post_recv(rdma->sc_qp, &ctxt->rc_recv_wr, NULL))
			return -EIO;
	}
	return 0;
}

static void kd_svc_send_ctxt_put(struct kd_svc_xprt *rdma,
				 struct kd_svc_send_ctxt *ctxt)
{
	unsigned int i;

	for (i = 1; i < ctxt->sc_cur_sge_no; i++)
		ib_dma_unmap_single(rdma->sc_dev, ctxt->sc_sges[i].addr,
				    ctxt->sc_sges[i].length, DMA_TO_DEVICE);
	spin_lock(&rdma->sc_send_lock);
	list_add(&ctxt->sc_list, &rdma->sc_send_ctxts);
	spin_unlock(&rdma->sc_send_lock);
}

static void kd_svc_wc_send(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_svc_send_ctxt *ctxt =
		container_of(wc->wr_cqe, struct kd_svc_send_ctxt, sc_cqe);
	struct kd_svc_xprt *rdma = ctxt->sc_xprt;

	atomic_inc(&rdma->sc_sq_avail);
	wake_up(&rdma->sc_send_wait);

	if (ctxt->sc_write_rw) {
		struct kd_svc_rw_ctxt *rw = ctxt->sc_write_rw;

		rdma_rw_ctx_destroy(&rw->rw_ctx, rdma->sc_qp, rdma->sc_port_num,
				    rw->rw_sg, rw->rw_nents, DMA_TO_DEVICE);
		kfree(rw);
		ctxt->sc_write_rw = NULL;
	}
	kd_svc_send_ctxt_put(rdma, ctxt);
	if (wc->status != IB_WC_SUCCESS)
		kd_svc_xprt_deferred_close(rdma);
}

struct kd_svc_send_ctxt *kd_svc_send_ctxt_get(struct kd_svc_xprt *rdma)
{
	struct kd_svc_send_ctxt *ctxt;

	spin_lock(&rdma->sc_send_lock);
	ctxt = list_first_entry_or_null(&rdma->sc_send_ctxts,
					struct kd_svc_send_ctxt, sc_list);
	if (ctxt)
		list_del(&ctxt->sc_list);
	spin_unlock(&rdma->sc_send_lock);
	if (!ctxt) {
		ctxt = kzalloc(sizeof(*ctxt), GFP_KERNEL);
		if (!ctxt)
			return NULL;
		ctxt->sc_xprt = rdma;
		ctxt->sc_cqe.done = kd_svc_wc_send;
	}
	ctxt->sc_cur_sge_no = 1;
	return ctxt;
}

static int kd_svc_post_send(struct kd_svc_xprt *rdma,
			    struct kd_svc_send_ctxt *ctxt)
{
	struct ib_send_wr *wr = &ctxt->sc_send_wr;

	/* every Reply completes: the completion frees its pages */
	wr->send_flags = IB_SEND_SIGNALED;
	wr->wr_cqe = &ctxt->sc_cqe;
	wr->sg_list = ctxt->sc_sges;
	wr->num_sge = ctxt->sc_cur_sge_no;

	while (atomic_dec_return(&rdma->sc_sq_avail) < 0) {
		atomic_inc(&rdma->sc_sq_avail);
		wait_event(rdma->sc_send_wait,
			   atomic_read(&rdma->sc_sq_avail) > 0);
	}

	if (ctxt->sc_write_rw)
		return rdma_rw_ctx_post(&ctxt->sc_write_rw->rw_ctx, rdma->sc_qp,
					rdma->sc_port_num, NULL, wr);
	return ib_post_send(rdma->sc_qp, wr, NULL);
}

int kd_svc_send_write_chunk(struct kd_svc_xprt *rdma,
			    struct kd_svc_recv_ctxt *rctxt,
			    struct kd_svc_send_ctxt *sctxt,
			    struct kd_svc_rw_ctxt *rw, u64 remote, u32 rkey)
{
	int ret;

	ret = rdma_rw_ctx_init(&rw->rw_ctx, rdma->sc_qp, rdma->sc_port_num,
			       rw->rw_sg, rw->rw_nents, 0, remote, rkey,
			       DMA_TO_DEVICE);
	if (ret < 0)
		return ret;

	sctxt->sc_write_rw = rw;
	/* SEND_WITH_INV only when the client gave us a single rkey */
	if (rdma->sc_snd_w_inv && rctxt->rc_inv_rkey) {
		sctxt->sc_send_wr.opcode = IB_WR_SEND_WITH_INV;
		sctxt->sc_send_wr.ex.invalidate_rkey = rctxt->rc_inv_rkey;
	} else {
		sctxt->sc_send_wr.opcode = IB_WR_SEND;
	}
	ret = kd_svc_post_send(rdma, sctxt);
	if (ret) {
		sctxt->sc_write_rw = NULL;
		rdma_rw_ctx_destroy(&rw->rw_ctx, rdma->sc_qp, rdma->sc_port_num,
				    rw->rw_sg, rw->rw_nents, DMA_TO_DEVICE);
	}
	return ret;
}

static void kd_svc_wc_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_svc_rw_ctxt *rw =
		container_of(wc->wr_cqe, struct kd_svc_rw_ctxt, rw_cqe);

	rw->rw_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&rw->rw_done);
}

/* Pull a Read chunk through the core: rdma_rw chooses SGEs or an MR. */
int kd_svc_pull_read_chunk(struct kd_svc_xprt *rdma,
			   struct kd_svc_recv_ctxt *rctxt,
			   struct kd_svc_rw_ctxt *rw)
{
	int ret;

	ret = rdma_rw_ctx_init(&rw->rw_ctx, rdma->sc_qp, rdma->sc_port_num, /* OK: rdma-access-flags-transport -- rdma_rw builds the READ and gives an iWARP sink REMOTE_WRITE itself */
			       rw->rw_sg, rw->rw_nents, 0, rctxt->rc_read_addr,
			       rctxt->rc_read_rkey, DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;

	rw->rw_cqe.done = kd_svc_wc_read_done;
	init_completion(&rw->rw_done);
	ret = rdma_rw_ctx_post(&rw->rw_ctx, rdma->sc_qp, rdma->sc_port_num,
			       &rw->rw_cqe, NULL);
	if (!ret) {
		wait_for_completion(&rw->rw_done);
		ret = rw->rw_status;
	}
	rdma_rw_ctx_destroy(&rw->rw_ctx, rdma->sc_qp, rdma->sc_port_num, /* OK: rdma-invalidation-leak -- the core owns the rw MRs and invalidates them when it reuses them */
			    rw->rw_sg, rw->rw_nents, DMA_FROM_DEVICE);
	return ret;
}

/* Small Read chunks: one hand-built READ, no rw context setup. */
int kd_svc_pull_small(struct kd_svc_xprt *rdma, struct kd_svc_recv_ctxt *rctxt,
		      struct kd_svc_rw_ctxt *rw, void *dst)
{
	struct ib_rdma_wr read_wr = { };
	struct ib_sge sge;
	u64 addr;
	int ret;

	if (rctxt->rc_read_len > KD_SVC_SMALL_READ)
		return kd_svc_pull_read_chunk(rdma, rctxt, rw);

	addr = ib_dma_map_single(rdma->sc_dev, dst, rctxt->rc_read_len,
				 DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(rdma->sc_dev, addr))
		return -EIO;

	sge.addr = addr;
	sge.length = rctxt->rc_read_len;
	sge.lkey = rdma->sc_pd->local_dma_lkey;

	rw->rw_cqe.done = kd_svc_wc_read_done;
	init_completion(&rw->rw_done);
	read_wr.wr.opcode = IB_WR_RDMA_READ;	// BUG: rdma-access-flags-transport -- READ sink addressed with pd->local_dma_lkey; on iWARP the sink needs REMOTE_WRITE rights, so this fails there
	read_wr.wr.wr_cqe = &rw->rw_cqe;
	read_wr.wr.sg_list = &sge;
	read_wr.wr.num_sge = 1;
	read_wr.wr.send_flags = IB_SEND_SIGNALED;
	read_wr.remote_addr = rctxt->rc_read_addr;
	read_wr.rkey = rctxt->rc_read_rkey;

	ret = ib_post_send(rdma->sc_qp, &read_wr.wr, NULL);
	if (!ret) {
		wait_for_completion(&rw->rw_done);
		ret = rw->rw_status;
	}
	ib_dma_unmap_single(rdma->sc_dev, addr, rctxt->rc_read_len,
			    DMA_FROM_DEVICE);
	return ret;
}

int kd_svc_accept(struct kd_svc_xprt *rdma)
{
	struct ib_device *dev = rdma->sc_cm_id->device;
	struct ib_qp_init_attr qp_attr;
	unsigned int ctxts, pd_flags = 0;
	int ret;

	rdma->sc_dev = dev;
	rdma->sc_port_num = rdma->sc_cm_id->port_num;
	rdma->sc_max_requests = min_t(u32, kd_svc_max_requests,
				      dev->attrs.max_qp_wr);
	rdma->sc_snd_w_inv = !!(dev->attrs.device_cap_flags &
				IB_DEVICE_MEM_MGT_EXTENSIONS);
	atomic_set(&rdma->sc_sq_avail, rdma->sc_max_requests);
	init_waitqueue_head(&rdma->sc_send_wait);
	INIT_LIST_HEAD(&rdma->sc_send_ctxts);
	INIT_LIST_HEAD(&rdma->sc_recv_ctxts);
	spin_lock_init(&rdma->sc_send_lock);

	if (kd_svc_trusted_fabric)
		pd_flags |= IB_PD_UNSAFE_GLOBAL_RKEY;
	rdma->sc_pd = ib_alloc_pd(dev, pd_flags);	// BUG: rdma-remote-access-overbroad -- the PD's global rkey opens all of memory to any peer; the server never even hands a key out
	if (IS_ERR(rdma->sc_pd))
		return PTR_ERR(rdma->sc_pd);

	ctxts = rdma_rw_mr_factor(dev, rdma->sc_port_num, KD_SVC_MAXPAGES);
	ctxts *= rdma->sc_max_requests;
	/* iWARP reports max_sge_rd = 1: Read chunks split into more contexts */
	if (rdma_protocol_iwarp(dev, rdma->sc_port_num))	// OK: rdma-access-flags-transport -- the transport test only sizes the rw context count, it chooses no access flags
		ctxts *= 2;

	rdma->sc_sq_cq = ib_cq_pool_get(dev, rdma->sc_max_requests + ctxts, 0,
					IB_POLL_WORKQUEUE);
	rdma->sc_rq_cq = ib_cq_pool_get(dev, rdma->sc_max_requests + 1, 0,
					IB_POLL_WORKQUEUE);
	if (IS_ERR(rdma->sc_sq_cq) || IS_ERR(rdma->sc_rq_cq)) {
		ret = -ENOMEM;
		goto out_cq;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = rdma;
	qp_attr.port_num = rdma->sc_port_num;
	qp_attr.cap.max_rdma_ctxs = ctxts;
	qp_attr.cap.max_send_wr = rdma->sc_max_requests;	// BUG(file): rdma-send-queue-undersized -- one Reply SEND per credit fills the queue; nothing is left for the WR that ib_drain_qp() posts at close
	qp_attr.cap.max_recv_wr = rdma->sc_max_requests;	// BUG(file): rdma-send-queue-undersized -- the receive queue is exactly as deep as the receives kept posted; the receive ib_drain_qp() posts finds no room
	qp_attr.cap.max_send_sge = KD_SVC_MAX_SEND_SGES;	// BUG(file): rdma-queue-cap-unchecked -- 16 send SGEs requested without looking at dev->attrs.max_send_sge
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.cap.max_inline_data = KD_SVC_INLINE_MAX;	// OK: rdma-queue-cap-unchecked -- the granted inline size is read back from cap after creation
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;	// OK: rdma-unsignaled-send-starvation -- every Reply and every rw chain is posted signaled
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = rdma->sc_sq_cq;
	qp_attr.recv_cq = rdma->sc_rq_cq;

	ret = rdma_create_qp(rdma->sc_cm_id, rdma->sc_pd, &qp_attr);
	if (ret)
		goto out_cq;
	rdma->sc_qp = rdma->sc_cm_id->qp;
	rdma->sc_max_inline = qp_attr.cap.max_inline_data;

	ret = kd_svc_post_recvs(rdma);
	if (ret)
		goto out_qp;
	return 0;

out_qp:
	rdma_destroy_qp(rdma->sc_cm_id);
out_cq:
	if (!IS_ERR(rdma->sc_rq_cq))
		ib_cq_pool_put(rdma->sc_rq_cq, rdma->sc_max_requests + 1);
	if (!IS_ERR(rdma->sc_sq_cq))
		ib_cq_pool_put(rdma->sc_sq_cq, rdma->sc_max_requests + ctxts);
	ib_dealloc_pd(rdma->sc_pd);
	return ret;
}

void kd_svc_free(struct kd_svc_xprt *rdma)
{
	struct kd_svc_send_ctxt *sctxt, *snext;

	ib_drain_qp(rdma->sc_qp);
	rdma_destroy_qp(rdma->sc_cm_id);
	list_for_each_entry_safe(sctxt, snext, &rdma->sc_send_ctxts, sc_list) {
		list_del(&sctxt->sc_list);
		kfree(sctxt);
	}
	ib_cq_pool_put(rdma->sc_rq_cq, rdma->sc_max_requests + 1);
	ib_dealloc_pd(rdma->sc_pd);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kd svcrdma-like NFS/RDMA server transport");
