// SPDX-License-Identifier: GPL-2.0
/*
 * td_kst_qp.c - kst target: queue pair setup and teardown, receive ring.
 *
 * The QP declares max_rdma_ctxs for the core R/W API and keeps a fixed
 * KST_SQ_DEPTH of its own; sq_wr_avail starts from the size the core
 * granted.  The receive ring keeps KST_RQ_DEPTH capsules posted and one
 * more entry is reserved for ib_drain_qp(); that depth is never compared
 * with the device's limit.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include "td_kst.h"

static void kst_recv_done(struct ib_cq *cq, struct ib_wc *wc);

static void kst_qp_event(struct ib_event *event, void *priv)
{
}

int kst_post_recv(struct kst_queue *queue, struct kst_cmd *cmd)
{
	cmd->cqe.done = kst_recv_done;
	cmd->sge = (struct ib_sge){ cmd->dma, KST_CAPSULE_SIZE, queue->dev->pd->local_dma_lkey };
	cmd->wr = (struct ib_recv_wr){ .wr_cqe = &cmd->cqe, .sg_list = &cmd->sge, .num_sge = 1 };
	return ib_post_recv(queue->qp, &cmd->wr, NULL);
}

int kst_create_queue_ib(struct kst_queue *queue)
{
	struct ib_device *dev = queue->dev->ib;
	struct ib_qp_init_attr qp_attr;
	unsigned int factor, nr_cqe;
	int ret, i;

	queue->port_num = queue->cm_id->port_num;
	factor = rdma_rw_mr_factor(dev, queue->port_num, KST_MAX_PAGES);
	nr_cqe = KST_RQ_DEPTH + 1 +
		 rdma_rw_max_send_wr(dev, queue->port_num, queue->send_queue_size * factor, 0);
	queue->nr_cqe = nr_cqe;
	queue->cq = ib_cq_pool_get(dev, nr_cqe, queue->comp_vector, IB_POLL_WORKQUEUE);
	if (IS_ERR(queue->cq))
		return PTR_ERR(queue->cq);

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.event_handler = kst_qp_event;
	qp_attr.qp_context = queue;
	qp_attr.send_cq = queue->cq;
	qp_attr.recv_cq = queue->cq;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.port_num = queue->port_num;
	/* OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- registration WRs of R/W contexts are accounted by max_rdma_ctxs, private pulls take sq_wr_avail credits */
	qp_attr.cap.max_send_wr = KST_SQ_DEPTH; // OK: rdma-queue-cap-unchecked -- the QP declares max_rdma_ctxs, rdma_rw_init_qp() clamps max_send_wr to max_qp_wr
	qp_attr.cap.max_rdma_ctxs = queue->send_queue_size * factor;
	qp_attr.cap.max_send_sge = max(dev->attrs.max_sge_rd, dev->attrs.max_send_sge);
	/* OK: rdma-send-queue-undersized -- one receive beyond the KST_RQ_DEPTH kept posted, for ib_drain_qp() */
	qp_attr.cap.max_recv_wr = KST_RQ_DEPTH + 1; // BUG: rdma-queue-cap-unchecked -- 2049 receives, never compared with attrs.max_qp_wr
	qp_attr.cap.max_recv_sge = 1;

	ret = rdma_create_qp(queue->cm_id, queue->dev->pd, &qp_attr);
	if (ret)
		goto out_put_cq;
	queue->qp = queue->cm_id->qp;
	atomic_set(&queue->sq_wr_avail, qp_attr.cap.max_send_wr);
	atomic_set(&queue->notify_unsignaled, 0);

	/* OK: rdma-access-flags-transport -- the transport test sizes READ scatter lists, it chooses no access rights */
	queue->max_read_sge = rdma_protocol_iwarp(dev, queue->port_num) ? 1 :
			      min(dev->attrs.max_sge_rd, dev->attrs.max_send_sge);

	INIT_LIST_HEAD(&queue->pull_mrs);
	ret = ib_mr_pool_init(queue->qp, &queue->pull_mrs, queue->send_queue_size,
			      IB_MR_TYPE_MEM_REG, KST_PULL_MAX_PAGES, 0);
	if (ret)
		goto out_destroy_qp;

	for (i = 0; i < KST_RQ_DEPTH; i++) {
		ret = kst_post_recv(queue, &queue->cmds[i]);
		if (ret)
			goto out_destroy_pool;
	}
	return 0;

out_destroy_pool:
	ib_mr_pool_destroy(queue->qp, &queue->pull_mrs);
out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_put_cq:
	ib_cq_pool_put(queue->cq, nr_cqe);
	return ret;
}

static void kst_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kst_cmd *cmd = container_of(wc->wr_cqe, struct kst_cmd, cqe);
	struct kst_queue *queue = cmd->queue;

	if (unlikely(wc->status != IB_WC_SUCCESS))
		return;
	kst_handle_capsule(queue, cmd, &queue->rsps[cmd - queue->cmds]);
}

void kst_destroy_queue_ib(struct kst_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->pull_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_cq_pool_put(queue->cq, queue->nr_cqe);
}

MODULE_DESCRIPTION("td kst RDMA block target");
MODULE_LICENSE("GPL");
