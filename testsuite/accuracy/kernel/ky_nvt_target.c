// SPDX-License-Identifier: GPL-2.0
/*
 * kyt: RDMA transport of a small NVMe-oF-style block target.
 *
 * One RC queue pair per host queue. Command capsules arrive in a receive
 * ring (with up to KYT_INLINE_SGES pages of in-capsule data); host data is
 * moved with the core's rdma_rw API: RDMA READ of write payloads, RDMA
 * WRITE of read payloads chained in front of the response SEND. The QP
 * declares cap.max_rdma_ctxs from rdma_rw_mr_factor(), so the core adds the
 * registration and data work requests to the send queue itself.
 *
 * Correct: send queue and rdma_rw sizing, signaling of the data and
 * response paths, SQ accounting in sq_wr_avail.
 * Wrong: the receive SGE count for in-capsule data is a constant that is
 * never compared with the device's max_recv_sge; the keep-alive NOP is
 * meant to be signaled every KYT_NOP_SIGNAL_EVERY posts, but the counter is
 * never advanced, so an idle queue slowly fills its send queue with
 * unsignaled NOPs.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- lifetime checks are not the subject of this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/scatterlist.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define KYT_INLINE_SGES		8
#define KYT_CMD_CAPSULE		64
#define KYT_RSP_CAPSULE		16
#define KYT_MAX_MDTS_PAGES	256
#define KYT_NOP_SIGNAL_EVERY	16

struct kyt_device {
	struct ib_device	*device;
	struct ib_pd		*pd;
	struct list_head	entry;
	int			refcount;
};

struct kyt_cmd {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge[1 + KYT_INLINE_SGES];
	void			*capsule;
	u64			capsule_dma;
	void			*inline_buf[KYT_INLINE_SGES];
	struct kyt_queue	*queue;
};

struct kyt_rsp {
	struct ib_cqe		send_cqe;
	struct ib_cqe		read_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	void			*rsp_buf;
	u64			rsp_dma;

	struct rdma_rw_ctx	rw;
	struct scatterlist	*sgl;
	u32			sg_cnt;
	int			n_rdma;
	bool			host_to_ctrl;
	u64			remote_addr;
	u32			rkey;
	u32			invalidate_rkey;

	struct kyt_cmd		*cmd;
	struct kyt_queue	*queue;
	struct list_head	free_list;
	struct list_head	wait_list;
};

struct kyt_nop {
	struct ib_cqe		cqe;
	struct ib_send_wr	wr;
	struct ib_sge		sge;
	void			*buf;
	u64			dma;
};

struct kyt_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	struct kyt_device	*dev;
	int			comp_vector;

	atomic_t		sq_wr_avail;
	spinlock_t		rsp_wait_lock;
	struct list_head	rsp_wait_list;
	spinlock_t		rsps_lock;
	struct list_head	free_rsps;
	struct kyt_rsp		*rsps;
	struct kyt_cmd		*cmds;
	int			send_queue_size;
	int			recv_queue_size;

	struct kyt_nop		nop;
	atomic_t		nop_unsignaled;
	struct delayed_work	keepalive;
};

/* provided by the target core */
int kyt_parse_command(struct kyt_rsp *rsp);
void kyt_req_execute(struct kyt_rsp *rsp);
void kyt_req_fail(struct kyt_rsp *rsp, int status);
void kyt_queue_error(struct kyt_queue *queue);

static void kyt_send_done(struct ib_cq *cq, struct ib_wc *wc);
static void kyt_read_data_done(struct ib_cq *cq, struct ib_wc *wc);
static void kyt_recv_done(struct ib_cq *cq, struct ib_wc *wc);
static void kyt_nop_done(struct ib_cq *cq, struct ib_wc *wc);

static int kyt_post_recv(struct kyt_queue *queue, struct kyt_cmd *cmd)
{
	ib_dma_sync_single_for_device(queue->dev->device, cmd->capsule_dma,
				      KYT_CMD_CAPSULE, DMA_FROM_DEVICE);
	return ib_post_recv(queue->qp, &cmd->wr, NULL);
}

static void kyt_free_cmd(struct ib_device *ibdev, struct kyt_cmd *c, int npages)
{
	int j;

	for (j = 0; j < npages; j++) {
		ib_dma_unmap_single(ibdev, c->sge[1 + j].addr, PAGE_SIZE,
				    DMA_FROM_DEVICE);
		kfree(c->inline_buf[j]);
	}
	ib_dma_unmap_single(ibdev, c->capsule_dma, KYT_CMD_CAPSULE,
			    DMA_FROM_DEVICE);
	kfree(c->capsule);
}

static int kyt_alloc_cmds(struct kyt_queue *queue)
{
	struct ib_device *ibdev = queue->dev->device;
	u32 lkey = queue->dev->pd->local_dma_lkey;
	int i, j;

	queue->cmds = kcalloc(queue->recv_queue_size, sizeof(*queue->cmds),
			      GFP_KERNEL);
	if (!queue->cmds)
		return -ENOMEM;

	for (i = 0; i < queue->recv_queue_size; i++) {
		struct kyt_cmd *c = &queue->cmds[i];

		c->capsule = kzalloc(KYT_CMD_CAPSULE, GFP_KERNEL);
		if (!c->capsule)
			goto out_unwind;
		c->capsule_dma = ib_dma_map_single(ibdev, c->capsule,
						   KYT_CMD_CAPSULE,
						   DMA_FROM_DEVICE);
		c->sge[0].addr = c->capsule_dma;
		c->sge[0].length = KYT_CMD_CAPSULE;
		c->sge[0].lkey = lkey;

		/* in-capsule data lands in its own pages */
		for (j = 0; j < KYT_INLINE_SGES; j++) {
			c->inline_buf[j] = kzalloc(PAGE_SIZE, GFP_KERNEL);
			if (!c->inline_buf[j]) {
				kyt_free_cmd(ibdev, c, j);
				goto out_unwind;
			}
			c->sge[1 + j].addr = ib_dma_map_single(ibdev,
					c->inline_buf[j], PAGE_SIZE,
					DMA_FROM_DEVICE);
			c->sge[1 + j].length = PAGE_SIZE;
			c->sge[1 + j].lkey = lkey;
		}

		c->wr.wr_cqe = &c->cqe;
		c->wr.sg_list = c->sge;
		c->wr.num_sge = 1 + KYT_INLINE_SGES;
	}
	return 0;

out_unwind:
	while (--i >= 0)
		kyt_free_cmd(ibdev, &queue->cmds[i], KYT_INLINE_SGES);
	kfree(queue->cmds);
	return -ENOMEM;
}

static int kyt_alloc_rsps(struct kyt_queue *queue)
{
	struct ib_device *ibdev = queue->dev->device;
	int i;

	queue->rsps = kcalloc(queue->send_queue_size, sizeof(*queue->rsps),
			      GFP_KERNEL);
	if (!queue->rsps)
		return -ENOMEM;

	for (i = 0; i < queue->send_queue_size; i++) {
		struct kyt_rsp *r = &queue->rsps[i];

		r->rsp_buf = kzalloc(KYT_RSP_CAPSULE, GFP_KERNEL);
		if (!r->rsp_buf)
			goto out_unwind;
		r->rsp_dma = ib_dma_map_single(ibdev, r->rsp_buf,
					       KYT_RSP_CAPSULE, DMA_TO_DEVICE);
		if (ib_dma_mapping_error(ibdev, r->rsp_dma)) {
			kfree(r->rsp_buf);
			goto out_unwind;
		}

		r->send_sge.addr = r->rsp_dma;
		r->send_sge.length = KYT_RSP_CAPSULE;
		r->send_sge.lkey = queue->dev->pd->local_dma_lkey;

		r->send_cqe.done = kyt_send_done;
		r->read_cqe.done = kyt_read_data_done;
		r->send_wr.wr_cqe = &r->send_cqe;
		r->send_wr.sg_list = &r->send_sge;
		r->send_wr.num_sge = 1;
		r->send_wr.opcode = IB_WR_SEND;
		r->send_wr.send_flags = IB_SEND_SIGNALED;
		r->queue = queue;
		list_add_tail(&r->free_list, &queue->free_rsps);
	}
	return 0;

out_unwind:
	while (--i >= 0) {
		struct kyt_rsp *r = &queue->rsps[i];

		ib_dma_unmap_single(ibdev, r->rsp_dma, KYT_RSP_CAPSULE,
				    DMA_TO_DEVICE);
		kfree(r->rsp_buf);
	}
	kfree(queue->rsps);
	return -ENOMEM;
}

static int kyt_create_queue_ib(struct kyt_queue *queue)
{
	struct ib_qp_init_attr qp_attr = { };
	struct kyt_device *ndev = queue->dev;
	struct ib_device *ibdev = ndev->device;
	unsigned int factor;
	int nr_cqe, ret, i;

	nr_cqe = queue->recv_queue_size + 2 * queue->send_queue_size;
	queue->cq = ib_cq_pool_get(ibdev, nr_cqe + 1, queue->comp_vector,
				   IB_POLL_WORKQUEUE);
	if (IS_ERR(queue->cq))
		return PTR_ERR(queue->cq);

	qp_attr.qp_context = queue;
	qp_attr.send_cq = queue->cq;
	qp_attr.recv_cq = queue->cq;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;

	/* response SEND and the RDMA WRITE it may follow, +1 for drain */
	// OK: rdma-send-queue-undersized -- one SEND per command plus slack; the rdma_rw work requests are added by the core through max_rdma_ctxs
	qp_attr.cap.max_send_wr = 2 * queue->send_queue_size + 1;	// OK: rdma-send-queue-manual-factor -- this file posts no REG_MR/LOCAL_INV and the QP declares max_rdma_ctxs
	factor = rdma_rw_mr_factor(ibdev, queue->cm_id->port_num,
				   KYT_MAX_MDTS_PAGES);
	qp_attr.cap.max_rdma_ctxs = queue->send_queue_size * factor;
	// OK: rdma-queue-cap-unchecked -- taken from the device's own limits
	qp_attr.cap.max_send_sge = max(ibdev->attrs.max_sge_rd,
				       ibdev->attrs.max_send_sge);
	qp_attr.cap.max_recv_wr = queue->recv_queue_size + 1;
	qp_attr.cap.max_recv_sge = 1 + KYT_INLINE_SGES;	// BUG: rdma-queue-cap-unchecked -- 9 receive SGEs requested without looking at attrs.max_recv_sge; creation fails on adapters with 4 or 6
	qp_attr.port_num = queue->cm_id->port_num;

	ret = rdma_create_qp(queue->cm_id, ndev->pd, &qp_attr);
	if (ret) {
		pr_err("kyt: failed to create QP: %d\n", ret);
		goto err_put_cq;
	}
	queue->qp = queue->cm_id->qp;

	/* the core grew max_send_wr for the rdma_rw contexts */
	atomic_set(&queue->sq_wr_avail, qp_attr.cap.max_send_wr);
	atomic_set(&queue->nop_unsignaled, 0);

	for (i = 0; i < queue->recv_queue_size; i++) {
		queue->cmds[i].cqe.done = kyt_recv_done;
		queue->cmds[i].queue = queue;
		ret = kyt_post_recv(queue, &queue->cmds[i]);
		if (ret)
			goto err_destroy_qp;
	}
	return 0;

err_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
err_put_cq:
	ib_cq_pool_put(queue->cq, nr_cqe + 1);
	return ret;
}

static void kyt_rw_ctx_destroy(struct kyt_rsp *rsp)
{
	struct rdma_cm_id *cm_id = rsp->queue->cm_id;

	if (!rsp->n_rdma)
		return;
	rdma_rw_ctx_destroy(&rsp->rw, cm_id->qp, cm_id->port_num, rsp->sgl,
			    rsp->sg_cnt, rsp->host_to_ctrl ?
			    DMA_FROM_DEVICE : DMA_TO_DEVICE);
	rsp->n_rdma = 0;
}

static void kyt_release_rsp(struct kyt_rsp *rsp)
{
	struct kyt_queue *queue = rsp->queue;
	unsigned long flags;

	atomic_add(1 + rsp->n_rdma, &queue->sq_wr_avail);
	kyt_rw_ctx_destroy(rsp);

	spin_lock_irqsave(&queue->rsps_lock, flags);
	list_add_tail(&rsp->free_list, &queue->free_rsps);
	spin_unlock_irqrestore(&queue->rsps_lock, flags);
}

/* Map the host buffer described by the command; returns 0 or -errno. */
int kyt_map_data(struct kyt_rsp *rsp, struct scatterlist *sgl, u32 sg_cnt)
{
	struct rdma_cm_id *cm_id = rsp->queue->cm_id;
	int ret;

	rsp->sgl = sgl;
	rsp->sg_cnt = sg_cnt;
	// OK: rdma-access-flags-transport -- rdma_rw builds the READ and gives an iWARP sink its rights
	ret = rdma_rw_ctx_init(&rsp->rw, cm_id->qp, cm_id->port_num, sgl,
			       sg_cnt, 0, rsp->remote_addr, rsp->rkey,
			       rsp->host_to_ctrl ? DMA_FROM_DEVICE :
						   DMA_TO_DEVICE);
	if (ret < 0)
		return ret;
	rsp->n_rdma = ret;
	return 0;
}

static bool kyt_execute_command(struct kyt_rsp *rsp)
{
	struct kyt_queue *queue = rsp->queue;
	struct rdma_cm_id *cm_id = queue->cm_id;

	if (unlikely(atomic_sub_return(1 + rsp->n_rdma,
				       &queue->sq_wr_avail) < 0)) {
		atomic_add(1 + rsp->n_rdma, &queue->sq_wr_avail);
		return false;
	}

	if (rsp->n_rdma && rsp->host_to_ctrl) {
		// OK: rdma-unsignaled-send-starvation -- the cqe is passed, so the core signals the last READ
		if (rdma_rw_ctx_post(&rsp->rw, cm_id->qp, cm_id->port_num,
				     &rsp->read_cqe, NULL))
			kyt_req_fail(rsp, -EIO);
	} else {
		kyt_req_execute(rsp);
	}
	return true;
}

static void kyt_process_wait_list(struct kyt_queue *queue)
{
	struct kyt_rsp *rsp, *tmp;

	spin_lock(&queue->rsp_wait_lock);
	list_for_each_entry_safe(rsp, tmp, &queue->rsp_wait_list, wait_list) {
		if (!kyt_execute_command(rsp))
			break;
		list_del(&rsp->wait_list);
	}
	spin_unlock(&queue->rsp_wait_lock);
}

/* Called by the target core when the backend has completed the command. */
void kyt_queue_response(struct kyt_rsp *rsp)
{
	struct kyt_queue *queue = rsp->queue;
	struct rdma_cm_id *cm_id = queue->cm_id;
	struct ib_send_wr *first_wr;

	if (rsp->invalidate_rkey) {
		rsp->send_wr.opcode = IB_WR_SEND_WITH_INV;
		rsp->send_wr.ex.invalidate_rkey = rsp->invalidate_rkey;
	} else {
		rsp->send_wr.opcode = IB_WR_SEND;
	}

	if (rsp->n_rdma && !rsp->host_to_ctrl)
		// OK: rdma-unsignaled-send-starvation -- the RDMA WRITEs are chained to the response SEND, which is signaled
		first_wr = rdma_rw_ctx_wrs(&rsp->rw, cm_id->qp, cm_id->port_num,
					   NULL, &rsp->send_wr);
	else
		first_wr = &rsp->send_wr;

	kyt_post_recv(queue, rsp->cmd);

	ib_dma_sync_single_for_device(queue->dev->device, rsp->rsp_dma,
				      KYT_RSP_CAPSULE, DMA_TO_DEVICE);
	if (unlikely(ib_post_send(cm_id->qp, first_wr, NULL))) {
		pr_err("kyt: sending response failed\n");
		kyt_release_rsp(rsp);
	}
}

static void kyt_read_data_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyt_rsp *rsp =
		container_of(wc->wr_cqe, struct kyt_rsp, read_cqe);
	struct kyt_queue *queue = rsp->queue;

	atomic_add(rsp->n_rdma, &queue->sq_wr_avail);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kyt_rw_ctx_destroy(rsp);
		kyt_req_fail(rsp, -EIO);
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			kyt_queue_error(queue);
		return;
	}
	kyt_req_execute(rsp);
}

static void kyt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyt_rsp *rsp =
		container_of(wc->wr_cqe, struct kyt_rsp, send_cqe);
	struct kyt_queue *queue = rsp->queue;

	kyt_release_rsp(rsp);

	if (unlikely(wc->status != IB_WC_SUCCESS &&
		     wc->status != IB_WC_WR_FLUSH_ERR)) {
		pr_err("kyt: SEND failed: %s\n", ib_wc_status_msg(wc->status));
		kyt_queue_error(queue);
	}
	if (!list_empty(&queue->rsp_wait_list))
		kyt_process_wait_list(queue);
}

static void kyt_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyt_cmd *cmd = container_of(wc->wr_cqe, struct kyt_cmd, cqe);
	struct kyt_queue *queue = cmd->queue;
	struct kyt_rsp *rsp = NULL;
	unsigned long flags;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			kyt_queue_error(queue);
		return;
	}

	spin_lock_irqsave(&queue->rsps_lock, flags);
	if (!list_empty(&queue->free_rsps)) {
		rsp = list_first_entry(&queue->free_rsps, struct kyt_rsp,
				       free_list);
		list_del(&rsp->free_list);
	}
	spin_unlock_irqrestore(&queue->rsps_lock, flags);
	if (!rsp) {
		kyt_post_recv(queue, cmd);
		return;
	}

	rsp->cmd = cmd;
	rsp->n_rdma = 0;
	rsp->invalidate_rkey = 0;
	/* parses the capsule and maps host data through kyt_map_data() */
	if (kyt_parse_command(rsp)) {
		kyt_queue_response(rsp);
		return;
	}
	if (!kyt_execute_command(rsp)) {
		spin_lock(&queue->rsp_wait_lock);
		list_add_tail(&rsp->wait_list, &queue->rsp_wait_list);
		spin_unlock(&queue->rsp_wait_lock);
	}
}

static void kyt_nop_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyt: keep-alive NOP failed\n");
}

/* Sent every five seconds by the keep-alive work, busy or idle. */
static int kyt_send_keepalive(struct kyt_queue *queue)
{
	struct kyt_nop *nop = &queue->nop;

	nop->cqe.done = kyt_nop_done;
	nop->sge.addr = nop->dma;
	nop->sge.length = KYT_RSP_CAPSULE;
	nop->sge.lkey = queue->dev->pd->local_dma_lkey;
	nop->wr.next = NULL;
	nop->wr.wr_cqe = &nop->cqe;
	nop->wr.sg_list = &nop->sge;
	nop->wr.num_sge = 1;
	nop->wr.opcode = IB_WR_SEND;
	nop->wr.send_flags = 0;

	// BUG: rdma-unsignaled-send-starvation -- nop_unsignaled is only ever reset, never incremented, so no NOP is signaled and an idle queue fills up
	if (atomic_read(&queue->nop_unsignaled) >= KYT_NOP_SIGNAL_EVERY) {
		nop->wr.send_flags = IB_SEND_SIGNALED;
		atomic_set(&queue->nop_unsignaled, 0);
	}

	return ib_post_send(queue->qp, &nop->wr, NULL);
}

static void kyt_keepalive_work(struct work_struct *work)
{
	struct delayed_work *dw = to_delayed_work(work);
	struct kyt_queue *queue = container_of(dw, struct kyt_queue, keepalive);

	if (kyt_send_keepalive(queue))
		kyt_queue_error(queue);
	queue_delayed_work(system_wq, &queue->keepalive, 5 * HZ);
}

static void kyt_destroy_queue_ib(struct kyt_queue *queue)
{
	cancel_delayed_work_sync(&queue->keepalive);
	ib_drain_qp(queue->qp);
	rdma_destroy_qp(queue->cm_id);
	ib_cq_pool_put(queue->cq, queue->recv_queue_size +
				  2 * queue->send_queue_size + 1);
}

int kyt_queue_start(struct kyt_queue *queue)
{
	int ret;

	INIT_LIST_HEAD(&queue->free_rsps);
	INIT_LIST_HEAD(&queue->rsp_wait_list);
	spin_lock_init(&queue->rsps_lock);
	spin_lock_init(&queue->rsp_wait_lock);
	INIT_DELAYED_WORK(&queue->keepalive, kyt_keepalive_work);

	queue->nop.buf = kzalloc(KYT_RSP_CAPSULE, GFP_KERNEL);
	if (!queue->nop.buf)
		return -ENOMEM;
	queue->nop.dma = ib_dma_map_single(queue->dev->device, queue->nop.buf,
					   KYT_RSP_CAPSULE, DMA_TO_DEVICE);

	ret = kyt_alloc_cmds(queue);
	if (ret)
		return ret;
	ret = kyt_alloc_rsps(queue);
	if (ret)
		return ret;
	ret = kyt_create_queue_ib(queue);
	if (ret)
		return ret;
	queue_delayed_work(system_wq, &queue->keepalive, 5 * HZ);
	return 0;
}

void kyt_queue_stop(struct kyt_queue *queue)
{
	rdma_disconnect(queue->cm_id);
	kyt_destroy_queue_ib(queue);
	kfree(queue->nop.buf);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kyt RDMA target transport");
