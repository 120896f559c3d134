// SPDX-License-Identifier: GPL-2.0
/*
 * sd_nvmet_rw.c - NVMe over Fabrics RDMA target: queue and data path.
 *
 * One sdt_queue per host queue.  Command capsules arrive in pre-posted
 * receives (recv_queue_size of them, reposted when the response goes out);
 * data moves with the core's rdma_rw API: RDMA READ for host-to-controller
 * data (rdma_rw_ctx_post() with read_cqe), RDMA WRITE for controller-to-host
 * data chained in front of the response SEND (rdma_rw_ctx_wrs()).  Every
 * command is answered by one signaled SEND, or SEND_WITH_INV when the host
 * asked for remote invalidation of its key.
 *
 * rdma_rw owns registration: the queue declares max_rdma_ctxs (send queue
 * size times rdma_rw_mr_factor()) and lets the core grow max_send_wr; the
 * send-queue credit counter starts from the grown value and each command is
 * charged 1 + the WR count rdma_rw_ctx_init() returned.
 *
 * Known problems: the receive queue is exactly as deep as the receives kept
 * posted, so ib_drain_qp() on teardown finds no room for its receive; the
 * receive SGE count (capsule + inline pages) is a constant never compared
 * with the device.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad -- not the subject of this file
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- not the subject of this file
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath -- not the subject of this file
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define SDT_MAX_MDTS		8	/* 2^8 pages per command */
#define SDT_INLINE_PAGES	4
#define SDT_MAX_SEND_SGE	8
#define SDT_OPC_WRITE		0x01
#define SDT_SGL_KEYED_INV	0x4f

struct sdt_capsule {
	u8	opcode;
	u8	flags;
	u16	command_id;
	__le32	nsid;
	__le64	rsvd2;
	__le64	metadata;
	__le64	addr;		/* keyed SGL */
	__le32	length;
	__le32	key;
	u8	sgl_type;
	u8	rsvd3[3];
	__le32	cdw10[4];
};

struct sdt_completion {
	__le64	result;
	__le16	sq_head;
	__le16	sq_id;
	u16	command_id;
	__le16	status;
};

struct sdt_device {
	struct ib_device	*device;
	struct ib_pd		*pd;
};

struct sdt_cmd {
	struct ib_sge		sge[1 + SDT_INLINE_PAGES];
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct sdt_capsule	*capsule;
	u64			capsule_dma;
	struct sdt_queue	*queue;
};

struct sdt_rsp {
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_cqe		read_cqe;
	struct sdt_completion	*cqe;
	u64			cqe_dma;
	struct sdt_cmd		*cmd;
	struct sdt_queue	*queue;
	struct rdma_rw_ctx	rw;
	struct sg_table		sgt;
	u32			data_len;
	int			n_rdma;
	enum dma_data_direction	dir;
	bool			invalidate;
	u32			invalidate_rkey;
	u16			status;
	struct list_head	free_list;
	struct list_head	wait_list;
};

struct sdt_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	int			nr_cqe;
	struct sdt_device	*dev;
	atomic_t		sq_wr_avail;
	spinlock_t		rsps_lock;
	struct list_head	free_rsps;
	struct sdt_rsp		*rsps;
	spinlock_t		rsp_wr_wait_lock;
	struct list_head	rsp_wr_wait_list;
	struct sdt_cmd		*cmds;
	int			send_queue_size;
	int			recv_queue_size;
	int			comp_vector;
	u32			port_num;
};

/* backend (namespace I/O), elsewhere in the target */
int sdt_backend_alloc_sgl(struct sg_table *sgt, u32 len);
void sdt_backend_execute(struct sdt_rsp *rsp);
int sdt_alloc_inline_pages(struct sdt_device *ndev, struct sdt_cmd *cmd);
void sdt_queue_response(struct sdt_rsp *rsp);

static void sdt_recv_done(struct ib_cq *cq, struct ib_wc *wc);
static void sdt_send_done(struct ib_cq *cq, struct ib_wc *wc);
static void sdt_read_data_done(struct ib_cq *cq, struct ib_wc *wc);

static int sdt_alloc_cmds(struct sdt_queue *queue)
{
	struct sdt_device *ndev = queue->dev;
	int i, nsge;

	queue->cmds = kcalloc(queue->recv_queue_size, sizeof(*queue->cmds), GFP_KERNEL);
	if (!queue->cmds)
		return -ENOMEM;
	for (i = 0; i < queue->recv_queue_size; i++) {
		struct sdt_cmd *c = &queue->cmds[i];

		c->capsule = kmalloc(sizeof(*c->capsule), GFP_KERNEL);
		if (!c->capsule)
			goto out_free;
		c->capsule_dma = ib_dma_map_single(ndev->device, c->capsule,
						   sizeof(*c->capsule), DMA_FROM_DEVICE);
		if (ib_dma_mapping_error(ndev->device, c->capsule_dma)) {
			kfree(c->capsule);
			goto out_free;
		}
		c->sge[0].addr = c->capsule_dma;
		c->sge[0].length = sizeof(*c->capsule);
		c->sge[0].lkey = ndev->pd->local_dma_lkey;
		nsge = sdt_alloc_inline_pages(ndev, c);
		c->cqe.done = sdt_recv_done;
		c->wr.wr_cqe = &c->cqe;
		c->wr.sg_list = c->sge;
		c->wr.num_sge = 1 + nsge;
		c->queue = queue;
	}
	return 0;

out_free:
	while (--i >= 0) {
		ib_dma_unmap_single(ndev->device, queue->cmds[i].capsule_dma,
				    sizeof(struct sdt_capsule), DMA_FROM_DEVICE);
		kfree(queue->cmds[i].capsule);
	}
	kfree(queue->cmds);
	return -ENOMEM;
}

static int sdt_alloc_rsps(struct sdt_queue *queue)
{
	struct ib_device *dev = queue->dev->device;
	int i;

	queue->rsps = kcalloc(queue->send_queue_size, sizeof(*queue->rsps), GFP_KERNEL);
	if (!queue->rsps)
		return -ENOMEM;
	for (i = 0; i < queue->send_queue_size; i++) {
		struct sdt_rsp *r = &queue->rsps[i];

		r->cqe = kzalloc(sizeof(*r->cqe), GFP_KERNEL);
		if (!r->cqe)
			goto out_free;
		r->cqe_dma = ib_dma_map_single(dev, r->cqe, sizeof(*r->cqe), DMA_TO_DEVICE);
		r->send_sge.addr = r->cqe_dma;
		r->send_sge.length = sizeof(*r->cqe);
		r->send_sge.lkey = queue->dev->pd->local_dma_lkey;
		r->send_cqe.done = sdt_send_done;
		r->read_cqe.done = sdt_read_data_done;
		r->send_wr.wr_cqe = &r->send_cqe;
		r->send_wr.sg_list = &r->send_sge;
		r->send_wr.num_sge = 1;
		r->send_wr.send_flags = IB_SEND_SIGNALED;	/* OK: rdma-unsignaled-send-starvation -- every response is signaled and retires the rdma_rw WRs chained ahead of it */
		r->queue = queue;
		list_add_tail(&r->free_list, &queue->free_rsps);
	}
	return 0;

out_free:
	while (--i >= 0) {
		ib_dma_unmap_single(dev, queue->rsps[i].cqe_dma, sizeof(struct sdt_completion), DMA_TO_DEVICE);
		kfree(queue->rsps[i].cqe);
	}
	kfree(queue->rsps);
	return -ENOMEM;
}

static int sdt_post_recv(struct sdt_device *ndev, struct sdt_cmd *cmd)
{
	ib_dma_sync_single_for_device(ndev->device, cmd->capsule_dma,
				      sizeof(*cmd->capsule), DMA_FROM_DEVICE);
	return ib_post_recv(cmd->queue->qp, &cmd->wr, NULL);
}

static struct sdt_rsp *sdt_get_rsp(struct sdt_queue *queue)
{
	struct sdt_rsp *rsp;
	unsigned long flags;

	spin_lock_irqsave(&queue->rsps_lock, flags);
	rsp = list_first_entry_or_null(&queue->free_rsps, struct sdt_rsp, free_list);
	if (rsp)
		list_del(&rsp->free_list);
	spin_unlock_irqrestore(&queue->rsps_lock, flags);
	return rsp;
}

static void sdt_put_rsp(struct sdt_rsp *rsp)
{
	unsigned long flags;

	spin_lock_irqsave(&rsp->queue->rsps_lock, flags);
	list_add_tail(&rsp->free_list, &rsp->queue->free_rsps);
	spin_unlock_irqrestore(&rsp->queue->rsps_lock, flags);
}

static bool sdt_execute_command(struct sdt_rsp *rsp)
{
	struct sdt_queue *queue = rsp->queue;

	if (unlikely(atomic_sub_return(1 + rsp->n_rdma, &queue->sq_wr_avail) < 0)) {
		atomic_add(1 + rsp->n_rdma, &queue->sq_wr_avail);
		return false;
	}
	if (rsp->n_rdma && rsp->dir == DMA_FROM_DEVICE) {
		/* OK: rdma-unsignaled-send-starvation -- given read_cqe, the core signals the last READ of the context */
		if (rdma_rw_ctx_post(&rsp->rw, queue->qp, queue->port_num, &rsp->read_cqe, NULL)) {
			rsp->status = 0x6;	/* internal error */
			sdt_queue_response(rsp);
		}
	} else {
		sdt_backend_execute(rsp);
	}
	return true;
}

static void sdt_process_wr_wait_list(struct sdt_queue *queue)
{
	spin_lock(&queue->rsp_wr_wait_lock);
	while (!list_empty(&queue->rsp_wr_wait_list)) {
		struct sdt_rsp *rsp = list_first_entry(&queue->rsp_wr_wait_list,
						       struct sdt_rsp, wait_list);

		spin_unlock(&queue->rsp_wr_wait_lock);
		if (!sdt_execute_command(rsp))
			return;		/* still no room; the next completion retries */
		spin_lock(&queue->rsp_wr_wait_lock);
		list_del(&rsp->wait_list);
	}
	spin_unlock(&queue->rsp_wr_wait_lock);
}

static void sdt_release_rsp(struct sdt_rsp *rsp)
{
	struct sdt_queue *queue = rsp->queue;

	atomic_add(1 + rsp->n_rdma, &queue->sq_wr_avail);
	if (rsp->n_rdma) {
		rdma_rw_ctx_destroy(&rsp->rw, queue->qp, queue->port_num,
				    rsp->sgt.sgl, rsp->sgt.nents, rsp->dir);
		rsp->n_rdma = 0;
	}
	if (rsp->sgt.sgl) {
		sg_free_table(&rsp->sgt);
		rsp->sgt.sgl = NULL;
	}
	if (!list_empty(&queue->rsp_wr_wait_list))
		sdt_process_wr_wait_list(queue);
	sdt_put_rsp(rsp);
}

void sdt_queue_response(struct sdt_rsp *rsp)
{
	struct sdt_queue *queue = rsp->queue;
	struct ib_send_wr *first_wr;

	rsp->cqe->command_id = rsp->cmd->capsule->command_id;
	rsp->cqe->status = (__le16)(rsp->status << 1);
	if (rsp->invalidate) {
		rsp->send_wr.opcode = IB_WR_SEND_WITH_INV;
		rsp->send_wr.ex.invalidate_rkey = rsp->invalidate_rkey;
	} else {
		rsp->send_wr.opcode = IB_WR_SEND;
	}

	if (rsp->n_rdma && rsp->dir == DMA_TO_DEVICE)
		/* OK: rdma-unsignaled-send-starvation -- the WRITEs are chained in front of the signaled response SEND */
		first_wr = rdma_rw_ctx_wrs(&rsp->rw, queue->qp, queue->port_num, NULL, &rsp->send_wr);
	else
		first_wr = &rsp->send_wr;

	sdt_post_recv(queue->dev, rsp->cmd);
	ib_dma_sync_single_for_device(queue->dev->device, rsp->cqe_dma,
				      sizeof(*rsp->cqe), DMA_TO_DEVICE);
	if (unlikely(ib_post_send(queue->qp, first_wr, NULL))) {
		pr_err("sdt: sending response for cmd %u failed\n", rsp->cqe->command_id);
		sdt_release_rsp(rsp);
	}
}

static void sdt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdt_rsp *rsp = container_of(wc->wr_cqe, struct sdt_rsp, send_cqe);

	sdt_release_rsp(rsp);
	if (unlikely(wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR))
		pr_err("sdt: SEND failed: %s\n", ib_wc_status_msg(wc->status));
}

static void sdt_read_data_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdt_rsp *rsp = container_of(wc->wr_cqe, struct sdt_rsp, read_cqe);
	struct sdt_queue *queue = rsp->queue;

	atomic_add(rsp->n_rdma, &queue->sq_wr_avail);
	rdma_rw_ctx_destroy(&rsp->rw, queue->qp, queue->port_num,
			    rsp->sgt.sgl, rsp->sgt.nents, rsp->dir);
	rsp->n_rdma = 0;
	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("sdt: RDMA READ failed: %s\n", ib_wc_status_msg(wc->status));
		sdt_release_rsp(rsp);
		return;
	}
	sdt_backend_execute(rsp);
}

static int sdt_map_data(struct sdt_rsp *rsp)
{
	struct sdt_capsule *c = rsp->cmd->capsule;
	struct sdt_queue *queue = rsp->queue;
	u64 addr = le64_to_cpu(c->addr);
	u32 key = le32_to_cpu(c->key);
	int ret;

	rsp->data_len = le32_to_cpu(c->length);
	if (!rsp->data_len)
		return 0;
	rsp->dir = c->opcode == SDT_OPC_WRITE ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	ret = sdt_backend_alloc_sgl(&rsp->sgt, rsp->data_len);
	if (ret)
		return ret;
	ret = rdma_rw_ctx_init(&rsp->rw, queue->qp, queue->port_num, rsp->sgt.sgl,
			       rsp->sgt.nents, 0, addr, key, rsp->dir);
	if (ret < 0) {
		sg_free_table(&rsp->sgt);
		rsp->sgt.sgl = NULL;
		return ret;
	}
	rsp->n_rdma += ret;
	if (c->sgl_type == SDT_SGL_KEYED_INV) {
		rsp->invalidate = true;
		rsp->invalidate_rkey = key;
	}
	return 0;
}

static void sdt_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdt_cmd *cmd = container_of(wc->wr_cqe, struct sdt_cmd, cqe);
	struct sdt_queue *queue = cmd->queue;
	struct sdt_rsp *rsp;

	if (unlikely(wc->status != IB_WC_SUCCESS))
		return;		/* flushed on teardown */
	ib_dma_sync_single_for_cpu(queue->dev->device, cmd->capsule_dma,
				   sizeof(*cmd->capsule), DMA_FROM_DEVICE);
	rsp = sdt_get_rsp(queue);
	if (unlikely(!rsp)) {
		pr_err("sdt: queue overrun, dropping command\n");
		sdt_post_recv(queue->dev, cmd);
		return;
	}
	rsp->cmd = cmd;
	rsp->n_rdma = 0;
	rsp->status = 0;
	rsp->invalidate = false;
	if (sdt_map_data(rsp)) {
		rsp->status = 0x2;	/* invalid field */
		sdt_queue_response(rsp);
		return;
	}
	if (!sdt_execute_command(rsp)) {
		spin_lock(&queue->rsp_wr_wait_lock);
		list_add_tail(&rsp->wait_list, &queue->rsp_wr_wait_list);
		spin_unlock(&queue->rsp_wr_wait_lock);
	}
}

static int sdt_create_queue_ib(struct sdt_queue *queue)
{
	struct sdt_device *ndev = queue->dev;
	struct ib_qp_init_attr qp_attr = { };
	unsigned int factor;
	int ret, i;

	queue->nr_cqe = queue->recv_queue_size + 2 * queue->send_queue_size + 1;
	queue->cq = ib_cq_pool_get(ndev->device, queue->nr_cqe, queue->comp_vector, IB_POLL_WORKQUEUE);
	if (IS_ERR(queue->cq))
		return PTR_ERR(queue->cq);

	qp_attr.qp_context = queue;
	qp_attr.send_cq = queue->cq;
	qp_attr.recv_cq = queue->cq;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	/* +1 for drain */
	qp_attr.cap.max_send_wr = queue->send_queue_size + 1;	/* OK: rdma-send-queue-undersized -- one response SEND per command plus one for the drain; the rdma_rw WRs are added by the core from max_rdma_ctxs */
	factor = rdma_rw_mr_factor(ndev->device, queue->cm_id->port_num, 1 << SDT_MAX_MDTS);
	qp_attr.cap.max_rdma_ctxs = queue->send_queue_size * factor;	/* OK: rdma-send-queue-manual-factor -- the factor is rdma_rw_mr_factor() and the core sizes the send queue from max_rdma_ctxs */
	qp_attr.cap.max_send_sge = min_t(u32, SDT_MAX_SEND_SGE, ndev->device->attrs.max_send_sge);	/* OK: rdma-queue-cap-unchecked -- clamped to the device's max_send_sge */
	qp_attr.cap.max_recv_wr = queue->recv_queue_size;	/* BUG(file): rdma-send-queue-undersized -- recv_queue_size receives stay posted and sdt_destroy_queue_ib() drains the QP: no entry is left for the drain's receive */
	qp_attr.cap.max_recv_sge = 1 + SDT_INLINE_PAGES;	/* BUG: rdma-queue-cap-unchecked -- five receive SGEs, never compared with attrs.max_recv_sge */
	qp_attr.port_num = queue->cm_id->port_num;

	ret = rdma_create_qp(queue->cm_id, ndev->pd, &qp_attr);
	if (ret) {
		pr_err("sdt: failed to create QP: %d\n", ret);
		goto err_put_cq;
	}
	queue->qp = queue->cm_id->qp;
	queue->port_num = queue->cm_id->port_num;
	/* the core grew max_send_wr for the rdma_rw contexts */
	atomic_set(&queue->sq_wr_avail, qp_attr.cap.max_send_wr);

	for (i = 0; i < queue->recv_queue_size; i++) {
		ret = sdt_post_recv(ndev, &queue->cmds[i]);
		if (ret)
			goto err_destroy_qp;
	}
	return 0;

err_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
err_put_cq:
	ib_cq_pool_put(queue->cq, queue->nr_cqe);
	return ret;
}

static void sdt_destroy_queue_ib(struct sdt_queue *queue)
{
	ib_drain_qp(queue->qp);
	rdma_destroy_qp(queue->cm_id);
	ib_cq_pool_put(queue->cq, queue->nr_cqe);
}

struct sdt_queue *sdt_alloc_queue(struct sdt_device *ndev, struct rdma_cm_id *cm_id,
				  int host_sqsize, int host_hrqsize, int comp_vector)
{
	struct sdt_queue *queue;
	int ret;

	queue = kzalloc(sizeof(*queue), GFP_KERNEL);
	if (!queue)
		return ERR_PTR(-ENOMEM);
	queue->cm_id = cm_id;
	queue->dev = ndev;
	queue->comp_vector = comp_vector;
	queue->send_queue_size = host_hrqsize;
	queue->recv_queue_size = host_sqsize;
	spin_lock_init(&queue->rsps_lock);
	spin_lock_init(&queue->rsp_wr_wait_lock);
	INIT_LIST_HEAD(&queue->free_rsps);
	INIT_LIST_HEAD(&queue->rsp_wr_wait_list);

	ret = sdt_alloc_cmds(queue);
	if (ret)
		goto out_free_queue;
	ret = sdt_alloc_rsps(queue);
	if (ret)
		goto out_free_cmds;
	ret = sdt_create_queue_ib(queue);
	if (ret)
		goto out_free_rsps;
	cm_id->context = queue;
	return queue;

out_free_rsps:
	kfree(queue->rsps);
out_free_cmds:
	kfree(queue->cmds);
out_free_queue:
	kfree(queue);
	return ERR_PTR(ret);
}

void sdt_free_queue(struct sdt_queue *queue)
{
	int i;

	rdma_disconnect(queue->cm_id);
	sdt_destroy_queue_ib(queue);
	for (i = 0; i < queue->send_queue_size; i++) {
		ib_dma_unmap_single(queue->dev->device, queue->rsps[i].cqe_dma,
				    sizeof(struct sdt_completion), DMA_TO_DEVICE);
		kfree(queue->rsps[i].cqe);
	}
	for (i = 0; i < queue->recv_queue_size; i++) {
		ib_dma_unmap_single(queue->dev->device, queue->cmds[i].capsule_dma,
				    sizeof(struct sdt_capsule), DMA_FROM_DEVICE);
		kfree(queue->cmds[i].capsule);
	}
	kfree(queue->rsps);
	kfree(queue->cmds);
	rdma_destroy_id(queue->cm_id);
	kfree(queue);
}

MODULE_DESCRIPTION("NVMe-oF RDMA target transport (rdma_rw)");
MODULE_LICENSE("GPL");
