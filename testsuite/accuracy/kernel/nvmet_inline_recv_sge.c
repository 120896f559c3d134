// SPDX-License-Identifier: GPL-2.0
/*
 * nvmtx: queue creation of an NVMe over Fabrics RDMA target with in-capsule
 * (inline) data spread over several receive SGEs, in the shape of
 * drivers/nvme/target/rdma.c nvmet_rdma_create_queue_ib() around the
 * "nvmet-rdma: support max(16KB, PAGE_SIZE) inline data" series (Steve
 * Wise, 2018). Written fresh for the held-out batch.
 *
 * Upstream derives the receive SGE count from the port's inline data size
 * and, in nvmet_rdma_find_get_device(), reduces it when the device reports
 * fewer receive SGEs ("inline_data_size %d cannot be supported by device
 * %s. Reducing to %lu."). This module posts receives with the full
 * 1 + NVMTX_MAX_INLINE_SGE entries on its I/O queues and never compares
 * that with attrs.max_recv_sge; the admin queue takes no inline data
 * beyond one page and reads the limit. Send-side sizing is left to
 * rdma_rw (max_rdma_ctxs) and is correct.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define NVMTX_MAX_INLINE_SGE	4
#define NVMTX_MAX_MDTS_PAGES	256

struct nvmtx_device {
	struct ib_device	*device;
	struct ib_pd		*pd;
	int			inline_page_count;
};

struct nvmtx_queue {
	struct rdma_cm_id	*cm_id;
	struct nvmtx_device	*dev;
	struct ib_cq		*cq;
	int			comp_vector;
	int			send_queue_size;
	int			recv_queue_size;
	int			host_qid;
	u32			port_num;
};

static int nvmtx_get_cq(struct nvmtx_queue *queue,
			struct ib_qp_init_attr *qp_attr, int nr_cqe)
{
	queue->cq = ib_cq_pool_get(queue->dev->device, nr_cqe + 1,
				   queue->comp_vector, IB_POLL_WORKQUEUE);
	if (IS_ERR(queue->cq))
		return PTR_ERR(queue->cq);

	qp_attr->qp_context = queue;
	qp_attr->send_cq = queue->cq;
	qp_attr->recv_cq = queue->cq;
	qp_attr->sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr->qp_type = IB_QPT_RC;
	return 0;
}

/**
 * nvmtx_create_io_queue_ib - create the QP of an I/O queue
 * @queue: the queue, sizes taken from the connect request
 */
int nvmtx_create_io_queue_ib(struct nvmtx_queue *queue)
{
	struct ib_device *ibdev = queue->dev->device;
	struct ib_qp_init_attr qp_attr = { };
	int factor, nr_cqe, ret;

	factor = rdma_rw_mr_factor(ibdev, queue->port_num,
				   NVMTX_MAX_MDTS_PAGES);
	/* +1 for drain */
	qp_attr.cap.max_send_wr = queue->send_queue_size + 1; /* OK: rdma-send-queue-manual-factor -- the send queue grows through max_rdma_ctxs with rdma_rw_mr_factor(), no hand-made factor */
	qp_attr.cap.max_rdma_ctxs = queue->send_queue_size * factor;
	qp_attr.cap.max_send_sge = max(ibdev->attrs.max_sge_rd,
				       ibdev->attrs.max_send_sge);
	qp_attr.port_num = queue->port_num;

	qp_attr.cap.max_recv_wr = 1 + queue->recv_queue_size;
	/* BUG: rdma-queue-cap-unchecked -- five receive SGEs (command capsule + NVMTX_MAX_INLINE_SGE inline pages) without comparing with attrs.max_recv_sge */
	qp_attr.cap.max_recv_sge = 1 + NVMTX_MAX_INLINE_SGE;

	nr_cqe = queue->recv_queue_size + 2 * queue->send_queue_size;
	ret = nvmtx_get_cq(queue, &qp_attr, nr_cqe);
	if (ret)
		return ret;

	ret = rdma_create_qp(queue->cm_id, queue->dev->pd, &qp_attr);
	if (ret) {
		pr_err("failed to create_qp ret= %d\n", ret);
		ib_cq_pool_put(queue->cq, nr_cqe + 1);
	}
	return ret;
}

/**
 * nvmtx_create_admin_queue_ib - create the QP of the admin queue
 * @queue: the admin queue
 */
int nvmtx_create_admin_queue_ib(struct nvmtx_queue *queue)
{
	struct nvmtx_device *ndev = queue->dev;
	struct ib_device *ibdev = ndev->device;
	struct ib_qp_init_attr qp_attr = { };
	int inline_sge_count, nr_cqe, ret;

	inline_sge_count = ibdev->attrs.max_recv_sge - 1;
	if (ndev->inline_page_count > inline_sge_count) {
		pr_warn("inline data cannot be supported by device %s. Reducing to %lu.\n",
			ibdev->name, inline_sge_count * PAGE_SIZE);
		ndev->inline_page_count = inline_sge_count;
	}

	qp_attr.cap.max_send_wr = queue->send_queue_size + 1;
	qp_attr.cap.max_rdma_ctxs = queue->send_queue_size;
	qp_attr.cap.max_send_sge = 1;
	qp_attr.port_num = queue->port_num;
	qp_attr.cap.max_recv_wr = 1 + queue->recv_queue_size;
	/* OK: rdma-queue-cap-unchecked -- the inline page count was reduced to what attrs.max_recv_sge allows just above */
	qp_attr.cap.max_recv_sge = 1 + ndev->inline_page_count;

	nr_cqe = queue->recv_queue_size + 2 * queue->send_queue_size;
	ret = nvmtx_get_cq(queue, &qp_attr, nr_cqe);
	if (ret)
		return ret;

	ret = rdma_create_qp(queue->cm_id, queue->dev->pd, &qp_attr);
	if (ret) {
		pr_err("failed to create_qp ret= %d\n", ret);
		ib_cq_pool_put(queue->cq, nr_cqe + 1);
	}
	return ret;
}

struct nvmtx_cmd {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge[1 + NVMTX_MAX_INLINE_SGE];
	u64			capsule_dma;
	u64			inline_dma[NVMTX_MAX_INLINE_SGE];
	int			nr_inline;
};

/**
 * nvmtx_post_recv - repost a command capsule and its inline pages
 * @queue: the queue
 * @cmd: the receive context
 */
int nvmtx_post_recv(struct nvmtx_queue *queue, struct nvmtx_cmd *cmd)
{
	u32 lkey = queue->dev->pd->local_dma_lkey;
	int i;

	cmd->sge[0].addr = cmd->capsule_dma;
	cmd->sge[0].length = 64;
	cmd->sge[0].lkey = lkey;
	for (i = 0; i < cmd->nr_inline; i++) {
		cmd->sge[i + 1].addr = cmd->inline_dma[i];
		cmd->sge[i + 1].length = PAGE_SIZE;
		cmd->sge[i + 1].lkey = lkey;
	}

	cmd->wr.next = NULL;
	cmd->wr.wr_cqe = &cmd->cqe;
	cmd->wr.sg_list = cmd->sge;
	cmd->wr.num_sge = 1 + cmd->nr_inline;

	return ib_post_recv(queue->cm_id->qp, &cmd->wr, NULL);
}

void nvmtx_destroy_queue_ib(struct nvmtx_queue *queue)
{
	struct ib_qp *qp = queue->cm_id->qp;

	ib_drain_qp(qp);
	rdma_destroy_id(queue->cm_id);
	ib_destroy_qp(qp);
	ib_cq_pool_put(queue->cq, queue->recv_queue_size +
		       2 * queue->send_queue_size + 1);
}
