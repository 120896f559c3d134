// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * zb_svcx_rw.c - server end of an RPC-over-RDMA style transport.
 *
 * Read chunks are pulled and Write/Reply chunks pushed with the rdma_rw API;
 * the QP declares cap.max_rdma_ctxs (depth times rdma_rw_mr_factor()) and
 * lets the core add the registration and invalidation work requests to
 * max_send_wr. Every Send Queue entry the transport posts itself is taken
 * from sc_sq_avail before the post, counted with the WQE count
 * rdma_rw_ctx_init() returns, and given back by the completion handlers.
 *
 * Open problems: the receive queue is exactly as deep as the receive ring
 * kept posted, so ib_drain_qp() at close has no room for its marker; short
 * error replies are sent inline with an inline size nobody checks against
 * what the device granted.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed for this file
 */

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define SVCX_MAX_SEND_SGES	18	/* transport header, 16 pages, tail */
#define SVCX_RECV_DEPTH		128
#define SVCX_RECV_SIZE		4096
#define SVCX_INLINE_ERR		256
#define SVCX_MAX_PAGES		257
#define SVCX_BC_REQUESTS	2

struct svcx_xprt;

struct svcx_recv_ctxt {
	struct ib_recv_wr	rc_wr;
	struct ib_cqe		rc_cqe;
	struct ib_sge		rc_sge;
	void			*rc_buf;
	struct svcx_xprt	*rc_xprt;
};

struct svcx_send_ctxt {
	struct list_head	sc_list;
	struct ib_send_wr	sc_wr;
	struct ib_cqe		sc_cqe;
	int			sc_sqecount;
	struct ib_sge		sc_sges[SVCX_MAX_SEND_SGES];
	void			*sc_hdr;
	struct svcx_xprt	*sc_xprt;
};

struct svcx_chunk_ctxt {
	struct ib_cqe		cc_cqe;
	struct svcx_xprt	*cc_xprt;
	struct rdma_rw_ctx	cc_rw;
	struct sg_table		cc_sgt;
	enum dma_data_direction	cc_dir;
	int			cc_sqecount;
	int			cc_status;
	struct completion	cc_done;
};

struct svcx_xprt {
	struct rdma_cm_id	*sc_cm_id;
	struct ib_device	*sc_dev;
	struct ib_qp		*sc_qp;
	struct ib_pd		*sc_pd;
	struct ib_cq		*sc_sq_cq;
	struct ib_cq		*sc_rq_cq;
	u32			sc_port_num;
	unsigned int		sc_max_requests;
	unsigned int		sc_max_bc_requests;
	unsigned int		sc_sq_depth;
	atomic_t		sc_sq_avail;
	wait_queue_head_t	sc_send_wait;
	spinlock_t		sc_send_lock;
	struct list_head	sc_send_ctxts;
	struct svcx_recv_ctxt	sc_recv_ctxts[SVCX_RECV_DEPTH];
	bool			sc_closing;
};

void svcx_handle_rpc(struct svcx_xprt *xprt, void *buf, u32 len);

static int svcx_sq_get(struct svcx_xprt *xprt, int sqecount)
{
	while (atomic_sub_return(sqecount, &xprt->sc_sq_avail) < 0) {
		atomic_add(sqecount, &xprt->sc_sq_avail);
		wait_event(xprt->sc_send_wait,
			   atomic_read(&xprt->sc_sq_avail) > sqecount ||
			   xprt->sc_closing);
		if (xprt->sc_closing)
			return -ENOTCONN;
	}
	return 0;
}

static void svcx_sq_put(struct svcx_xprt *xprt, int sqecount)
{
	atomic_add(sqecount, &xprt->sc_sq_avail);
	wake_up(&xprt->sc_send_wait);
}

/* ---- receive side ---- */

static void svcx_wc_receive(struct ib_cq *cq, struct ib_wc *wc);

static int svcx_post_recv(struct svcx_xprt *xprt, struct svcx_recv_ctxt *ctxt)
{
	ctxt->rc_cqe.done = svcx_wc_receive;
	ctxt->rc_wr.next = NULL;
	ctxt->rc_wr.wr_cqe = &ctxt->rc_cqe;
	ctxt->rc_wr.sg_list = &ctxt->rc_sge;
	ctxt->rc_wr.num_sge = 1;
	return ib_post_recv(xprt->sc_qp, &ctxt->rc_wr, NULL);
}

static int svcx_post_recvs(struct svcx_xprt *xprt)
{
	struct svcx_recv_ctxt *ctxt;
	int i, ret;

	for (i = 0; i < SVCX_RECV_DEPTH; i++) {
		ctxt = &xprt->sc_recv_ctxts[i];
		ctxt->rc_xprt = xprt;
		ctxt->rc_buf = kmalloc(SVCX_RECV_SIZE, GFP_KERNEL);
		if (!ctxt->rc_buf)
			return -ENOMEM;
		ctxt->rc_sge.addr = ib_dma_map_single(xprt->sc_dev, ctxt->rc_buf,
						      SVCX_RECV_SIZE,
						      DMA_FROM_DEVICE);
		ctxt->rc_sge.length = SVCX_RECV_SIZE;
		ctxt->rc_sge.lkey = xprt->sc_pd->local_dma_lkey;
		ret = svcx_post_recv(xprt, ctxt);
		if (ret)
			return ret;
	}
	return 0;
}

static void svcx_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct svcx_recv_ctxt *ctxt =
		container_of(wc->wr_cqe, struct svcx_recv_ctxt, rc_cqe);
	struct svcx_xprt *xprt = ctxt->rc_xprt;

	if (wc->status != IB_WC_SUCCESS)
		return;
	ib_dma_sync_single_for_cpu(xprt->sc_dev, ctxt->rc_sge.addr,
				   wc->byte_len, DMA_FROM_DEVICE);
	svcx_handle_rpc(xprt, ctxt->rc_buf, wc->byte_len);
	if (!xprt->sc_closing)
		svcx_post_recv(xprt, ctxt);
}

/* ---- send side ---- */

static void svcx_wc_send(struct ib_cq *cq, struct ib_wc *wc)
{
	struct svcx_send_ctxt *ctxt =
		container_of(wc->wr_cqe, struct svcx_send_ctxt, sc_cqe);
	struct svcx_xprt *xprt = ctxt->sc_xprt;

	svcx_sq_put(xprt, ctxt->sc_sqecount);
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("svcx: send failed: %s\n", ib_wc_status_msg(wc->status));

	spin_lock(&xprt->sc_send_lock);
	list_add(&ctxt->sc_list, &xprt->sc_send_ctxts);
	spin_unlock(&xprt->sc_send_lock);
}

/* Post a reply. The caller has mapped the transport header and the pages
 * into sc_sges[] and set sc_wr.num_sge; write_chunk (optional) is an
 * initialised rw context that carries the RDMA Writes ahead of the Send. */
int svcx_send_reply(struct svcx_xprt *xprt, struct svcx_send_ctxt *ctxt,
		    struct svcx_chunk_ctxt *write_chunk)
{
	struct ib_send_wr *first = &ctxt->sc_wr;
	int ret;

	ctxt->sc_cqe.done = svcx_wc_send;
	ctxt->sc_wr.next = NULL;
	ctxt->sc_wr.wr_cqe = &ctxt->sc_cqe;
	ctxt->sc_wr.sg_list = ctxt->sc_sges;
	ctxt->sc_wr.opcode = IB_WR_SEND;
	ctxt->sc_wr.send_flags = IB_SEND_SIGNALED;	/* OK: rdma-unsignaled-send-starvation -- every reply is signaled and returns its SQ entries */
	ctxt->sc_sqecount = 1;

	if (write_chunk) {
		ctxt->sc_sqecount += write_chunk->cc_sqecount;
		first = rdma_rw_ctx_wrs(&write_chunk->cc_rw, xprt->sc_qp,
					xprt->sc_port_num, NULL, &ctxt->sc_wr);
	}

	ret = svcx_sq_get(xprt, ctxt->sc_sqecount);
	if (ret)
		return ret;
	ret = ib_post_send(xprt->sc_qp, first, NULL);
	if (ret)
		svcx_sq_put(xprt, ctxt->sc_sqecount);
	return ret;
}

/* A short RPC error reply, copied into the WQE. */
int svcx_send_error(struct svcx_xprt *xprt, struct svcx_send_ctxt *ctxt,
		    void *msg, u32 len)
{
	int ret;

	if (len > SVCX_INLINE_ERR)
		return -EMSGSIZE;
	ctxt->sc_sges[0].addr = (uintptr_t)msg;
	ctxt->sc_sges[0].length = len;
	ctxt->sc_sges[0].lkey = xprt->sc_pd->local_dma_lkey;
	ctxt->sc_cqe.done = svcx_wc_send;
	ctxt->sc_wr.next = NULL;
	ctxt->sc_wr.wr_cqe = &ctxt->sc_cqe;
	ctxt->sc_wr.sg_list = ctxt->sc_sges;
	ctxt->sc_wr.num_sge = 1;
	ctxt->sc_wr.opcode = IB_WR_SEND;
	ctxt->sc_wr.send_flags = IB_SEND_INLINE | IB_SEND_SIGNALED;
	ctxt->sc_sqecount = 1;

	ret = svcx_sq_get(xprt, 1);
	if (ret)
		return ret;
	ret = ib_post_send(xprt->sc_qp, &ctxt->sc_wr, NULL);
	if (ret)
		svcx_sq_put(xprt, 1);
	return ret;
}

/* ---- read chunks ---- */

static void svcx_wc_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct svcx_chunk_ctxt *cc =
		container_of(wc->wr_cqe, struct svcx_chunk_ctxt, cc_cqe);
	struct svcx_xprt *xprt = cc->cc_xprt;

	svcx_sq_put(xprt, cc->cc_sqecount);
	cc->cc_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	rdma_rw_ctx_destroy(&cc->cc_rw, xprt->sc_qp, xprt->sc_port_num,
			    cc->cc_sgt.sgl, cc->cc_sgt.nents, cc->cc_dir);
	complete(&cc->cc_done);
}

int svcx_pull_read_chunk(struct svcx_xprt *xprt, struct svcx_chunk_ctxt *cc,
			 u64 offset, u32 handle)
{
	int ret;

	cc->cc_xprt = xprt;
	cc->cc_dir = DMA_FROM_DEVICE;
	cc->cc_cqe.done = svcx_wc_read_done;
	init_completion(&cc->cc_done);

	/* OK: rdma-local-mr-management, rdma-access-flags-transport -- rdma_rw_ctx_init() registers the sink and handles iWARP itself */
	ret = rdma_rw_ctx_init(&cc->cc_rw, xprt->sc_qp, xprt->sc_port_num,
			       cc->cc_sgt.sgl, cc->cc_sgt.nents, 0, offset,
			       handle, DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	cc->cc_sqecount = ret;

	ret = svcx_sq_get(xprt, cc->cc_sqecount);
	if (ret)
		goto out_destroy;
	/* OK: rdma-unsignaled-send-starvation -- the core signals the last WR of the context, cc_cqe gets the completion */
	ret = rdma_rw_ctx_post(&cc->cc_rw, xprt->sc_qp, xprt->sc_port_num,
			       &cc->cc_cqe, NULL);
	if (ret) {
		svcx_sq_put(xprt, cc->cc_sqecount);
		goto out_destroy;
	}
	wait_for_completion(&cc->cc_done);
	return cc->cc_status;

out_destroy:
	rdma_rw_ctx_destroy(&cc->cc_rw, xprt->sc_qp, xprt->sc_port_num,
			    cc->cc_sgt.sgl, cc->cc_sgt.nents, DMA_FROM_DEVICE);
	return ret;
}

/* ---- connection setup and teardown ---- */

static int svcx_create_qp(struct svcx_xprt *xprt)
{
	struct ib_device *dev = xprt->sc_dev;
	struct ib_qp_init_attr qp_attr;
	unsigned int ctxts, sq_depth;
	int ret;

	ctxts = rdma_rw_mr_factor(dev, xprt->sc_port_num, SVCX_MAX_PAGES);
	ctxts *= xprt->sc_max_requests;
	sq_depth = xprt->sc_max_requests + xprt->sc_max_bc_requests + 1;

	xprt->sc_sq_depth = sq_depth + rdma_rw_max_send_wr(dev, xprt->sc_port_num,
							  ctxts, 0);
	if (xprt->sc_sq_depth > dev->attrs.max_qp_wr)
		xprt->sc_sq_depth = dev->attrs.max_qp_wr;
	atomic_set(&xprt->sc_sq_avail, xprt->sc_sq_depth - 1);

	xprt->sc_sq_cq = ib_alloc_cq(dev, xprt, xprt->sc_sq_depth, 0,
				     IB_POLL_WORKQUEUE);
	if (IS_ERR(xprt->sc_sq_cq))
		return PTR_ERR(xprt->sc_sq_cq);
	xprt->sc_rq_cq = ib_alloc_cq(dev, xprt, SVCX_RECV_DEPTH, 0,
				     IB_POLL_WORKQUEUE);
	if (IS_ERR(xprt->sc_rq_cq)) {
		ret = PTR_ERR(xprt->sc_rq_cq);
		goto err_sq_cq;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = xprt;
	qp_attr.port_num = xprt->sc_port_num;
	qp_attr.cap.max_rdma_ctxs = ctxts;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- one Send per request plus one for the drain; rdma_rw_init_qp() adds the rw contexts */
	qp_attr.cap.max_send_wr = sq_depth;
	qp_attr.cap.max_recv_wr = SVCX_RECV_DEPTH;	/* BUG(file): rdma-send-queue-undersized -- the whole receive ring stays posted, no slot is left for the ib_drain_qp() marker */
	qp_attr.cap.max_send_sge = SVCX_MAX_SEND_SGES;	/* OK: rdma-queue-cap-unchecked -- svcx_accept() refuses devices with fewer send SGEs */
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.cap.max_inline_data = SVCX_INLINE_ERR;	/* BUG: rdma-queue-cap-unchecked -- 256 bytes of inline data requested, never checked against what the device grants */
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = xprt->sc_sq_cq;
	qp_attr.recv_cq = xprt->sc_rq_cq;

	ret = rdma_create_qp(xprt->sc_cm_id, xprt->sc_pd, &qp_attr);
	if (ret)
		goto err_rq_cq;
	xprt->sc_qp = xprt->sc_cm_id->qp;
	return 0;

err_rq_cq:
	ib_free_cq(xprt->sc_rq_cq);
err_sq_cq:
	ib_free_cq(xprt->sc_sq_cq);
	return ret;
}

int svcx_accept(struct svcx_xprt *xprt, unsigned int max_requests)
{
	struct ib_device *dev = xprt->sc_cm_id->device;
	int ret;

	xprt->sc_dev = dev;
	xprt->sc_port_num = xprt->sc_cm_id->port_num;
	if (dev->attrs.max_send_sge < SVCX_MAX_SEND_SGES) {
		pr_err("svcx: %s: only %d send SGEs\n", dev->name,
		       dev->attrs.max_send_sge);
		return -EOPNOTSUPP;
	}
	xprt->sc_max_requests = min_t(unsigned int, max_requests,
				      dev->attrs.max_qp_wr / 4);
	xprt->sc_max_bc_requests = SVCX_BC_REQUESTS;
	init_waitqueue_head(&xprt->sc_send_wait);
	spin_lock_init(&xprt->sc_send_lock);
	INIT_LIST_HEAD(&xprt->sc_send_ctxts);

	xprt->sc_pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(xprt->sc_pd))
		return PTR_ERR(xprt->sc_pd);
	ret = svcx_create_qp(xprt);
	if (ret)
		goto err_pd;
	ret = svcx_post_recvs(xprt);
	if (ret)
		goto err_qp;
	return 0;

err_qp:
	rdma_destroy_qp(xprt->sc_cm_id);
	ib_free_cq(xprt->sc_rq_cq);
	ib_free_cq(xprt->sc_sq_cq);
err_pd:
	ib_dealloc_pd(xprt->sc_pd);
	return ret;
}

void svcx_close(struct svcx_xprt *xprt)
{
	int i;

	xprt->sc_closing = true;
	wake_up_all(&xprt->sc_send_wait);
	rdma_disconnect(xprt->sc_cm_id);
	ib_drain_qp(xprt->sc_qp);

	for (i = 0; i < SVCX_RECV_DEPTH; i++) {
		struct svcx_recv_ctxt *ctxt = &xprt->sc_recv_ctxts[i];

		if (!ctxt->rc_buf)
			continue;
		ib_dma_unmap_single(xprt->sc_dev, ctxt->rc_sge.addr,
				    SVCX_RECV_SIZE, DMA_FROM_DEVICE);
		kfree(ctxt->rc_buf);
	}
	rdma_destroy_qp(xprt->sc_cm_id);
	ib_free_cq(xprt->sc_rq_cq);
	ib_free_cq(xprt->sc_sq_cq);
	ib_dealloc_pd(xprt->sc_pd);
}

MODULE_LICENSE("Dual BSD/GPL");
MODULE_DESCRIPTION("RPC-over-RDMA server transport (rdma_rw)");
