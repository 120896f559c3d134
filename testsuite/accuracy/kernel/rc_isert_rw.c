// SPDX-License-Identifier: GPL-2.0
/*
 * rc_isert_rw.c - istx: an iSER-target-style RDMA transport.
 *
 * One RC QP per connection, created through rdma_cm.  iSCSI PDUs arrive
 * as SENDs into a ring of ISTX_RX_RING receive descriptors that are
 * re-posted as soon as the PDU has been copied out.  Data-Out is pulled
 * with RDMA READs and Data-In pushed with RDMA WRITEs chained in front of
 * the response SEND, both through rdma_rw contexts: registration and its
 * work requests are the core's business and are accounted through
 * cap.max_rdma_ctxs.  A delayed work sends NOP-In keepalives; those are
 * meant to be signaled once every ISTX_NOPIN_SIG_EVERY.  Teardown
 * disconnects and drains the QP before freeing anything.
 *
 * Wrong here: the receive queue is exactly as deep as the receive ring,
 * so the receive that ib_drain_qp() posts finds no free slot; the NOP-In
 * signaling counter is only ever reset; max_send_sge is a constant the
 * device was never asked about.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-invalidate-unchecked, rdma-unmap-before-invalidate -- not reviewed for this module
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/printk.h>
#include <linux/kernel.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define ISTX_CMDS_MAX		1536
#define ISTX_MAX_TX_MISC	4	/* NOP-In, reject, async event, logout */
#define ISTX_RX_RING		512
#define ISTX_MAX_SGE		16
#define ISTX_MAX_PAGES		256	/* 1 MiB per command */
#define ISTX_HDR_LEN		76	/* iSER header + BHS */
#define ISTX_RX_PAYLOAD		8192
#define ISTX_NOPIN_MS		1000
#define ISTX_NOPIN_SIG_EVERY	16

struct istx_conn;

struct istx_rx_desc {
	u8			buf[ISTX_HDR_LEN + ISTX_RX_PAYLOAD];
	u64			dma_addr;
	struct ib_sge		sge;
	struct ib_recv_wr	wr;
	struct ib_cqe		cqe;
	struct istx_conn	*conn;
};

struct istx_tx_desc {
	u8			hdr[ISTX_HDR_LEN];
	u64			dma_addr;
	struct ib_sge		sge;
	struct ib_send_wr	send_wr;
	struct ib_cqe		cqe;
};

struct istx_cmd {
	struct istx_conn	*conn;
	struct list_head	node;
	struct rdma_rw_ctx	rw;
	bool			rw_live;
	struct scatterlist	*sg;
	u32			sg_cnt;
	u64			remote_addr;
	u32			rkey;
	struct ib_cqe		read_cqe;
	struct istx_tx_desc	tx;
};

struct istx_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			port_num;
	u32			cq_size;
	struct istx_rx_desc	*rx_descs;
	struct istx_cmd		*cmds;
	struct list_head	free_cmds;
	spinlock_t		lock;
	struct istx_tx_desc	nopin_tx;
	atomic_t		nopin_unsignaled;
	struct delayed_work	keepalive;
};

/* target core glue, elsewhere */
int istx_core_submit(struct istx_cmd *cmd, const u8 *pdu, u32 len);
void istx_core_data_out_done(struct istx_cmd *cmd, int status);
void istx_core_release(struct istx_cmd *cmd);
void istx_build_nopin(struct istx_conn *conn, u8 *hdr);

static void istx_recv_done(struct ib_cq *cq, struct ib_wc *wc);
static void istx_send_done(struct ib_cq *cq, struct ib_wc *wc);

static int istx_create_qp(struct istx_conn *conn)
{
	struct ib_qp_init_attr attr;
	unsigned int factor;
	int ret;

	factor = rdma_rw_mr_factor(conn->dev, conn->port_num, ISTX_MAX_PAGES);
	conn->cq_size = rdma_rw_max_send_wr(conn->dev, conn->port_num,
					    ISTX_CMDS_MAX * factor, 0) +
			ISTX_CMDS_MAX + ISTX_MAX_TX_MISC + 1 + ISTX_RX_RING;
	conn->cq = ib_cq_pool_get(conn->dev, conn->cq_size, -1, IB_POLL_WORKQUEUE);
	if (IS_ERR(conn->cq))
		return PTR_ERR(conn->cq);

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	/* OK: rdma-send-queue-undersized -- one response SEND per command, the misc PDUs and one slot for the drain; the RDMA READ/WRITE chains are counted through max_rdma_ctxs */
	attr.cap.max_send_wr = ISTX_CMDS_MAX + ISTX_MAX_TX_MISC + 1; // OK: rdma-queue-cap-unchecked -- the QP declares max_rdma_ctxs, so rdma_rw_init_qp() clamps max_send_wr to max_qp_wr
	/* OK: rdma-send-queue-manual-factor -- the registration factor comes from rdma_rw_mr_factor() through max_rdma_ctxs */
	attr.cap.max_rdma_ctxs = ISTX_CMDS_MAX * factor;
	attr.cap.max_recv_wr = ISTX_RX_RING; // BUG(file): rdma-send-queue-undersized -- every slot holds a posted receive, so the receive ib_drain_qp() posts at teardown never fits
	attr.cap.max_send_sge = ISTX_MAX_SGE; // BUG: rdma-queue-cap-unchecked -- 16 send SGEs without comparing with dev->attrs.max_send_sge
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.port_num = conn->port_num;

	ret = rdma_create_qp(conn->cm_id, conn->pd, &attr);
	if (ret) {
		pr_err("istx: rdma_create_qp failed: %d\n", ret);
		ib_cq_pool_put(conn->cq, conn->cq_size);
		return ret;
	}
	conn->qp = conn->cm_id->qp;
	return 0;
}

static int istx_post_recv(struct istx_conn *conn, struct istx_rx_desc *rx)
{
	rx->sge.addr = rx->dma_addr;
	rx->sge.length = sizeof(rx->buf);
	rx->sge.lkey = conn->pd->local_dma_lkey;
	rx->cqe.done = istx_recv_done;
	rx->wr.wr_cqe = &rx->cqe;
	rx->wr.sg_list = &rx->sge;
	rx->wr.num_sge = 1;
	rx->wr.next = NULL;
	return ib_post_recv(conn->qp, &rx->wr, NULL);
}

static int istx_alloc_rx_ring(struct istx_conn *conn)
{
	int i;

	conn->rx_descs = kcalloc(ISTX_RX_RING, sizeof(*conn->rx_descs), GFP_KERNEL);
	if (!conn->rx_descs)
		return -ENOMEM;
	for (i = 0; i < ISTX_RX_RING; i++) {
		struct istx_rx_desc *rx = &conn->rx_descs[i];

		rx->conn = conn;
		rx->dma_addr = ib_dma_map_single(conn->dev, rx->buf, sizeof(rx->buf),
						 DMA_FROM_DEVICE);
		if (ib_dma_mapping_error(conn->dev, rx->dma_addr))
			goto unwind;
	}
	for (i = 0; i < ISTX_RX_RING; i++)
		if (istx_post_recv(conn, &conn->rx_descs[i]))
			return -EIO;
	return 0;

unwind:
	while (i--)
		ib_dma_unmap_single(conn->dev, conn->rx_descs[i].dma_addr,
				    sizeof(conn->rx_descs[i].buf), DMA_FROM_DEVICE);
	kfree(conn->rx_descs);
	conn->rx_descs = NULL;
	return -ENOMEM;
}

static void istx_prep_tx(struct istx_conn *conn, struct istx_tx_desc *tx,
			 void (*done)(struct ib_cq *cq, struct ib_wc *wc))
{
	tx->sge.addr = tx->dma_addr;
	tx->sge.length = ISTX_HDR_LEN;
	tx->sge.lkey = conn->pd->local_dma_lkey;
	tx->cqe.done = done;
	memset(&tx->send_wr, 0, sizeof(tx->send_wr));
	tx->send_wr.wr_cqe = &tx->cqe;
	tx->send_wr.sg_list = &tx->sge;
	tx->send_wr.num_sge = 1;
	tx->send_wr.opcode = IB_WR_SEND;
	tx->send_wr.send_flags = IB_SEND_SIGNALED;
	ib_dma_sync_single_for_device(conn->dev, tx->dma_addr, ISTX_HDR_LEN,
				      DMA_TO_DEVICE);
}

static void istx_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct istx_rx_desc *rx = container_of(wc->wr_cqe, struct istx_rx_desc, cqe);
	struct istx_conn *conn = rx->conn;
	struct istx_cmd *cmd;
	unsigned long flags;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("istx: recv failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	ib_dma_sync_single_for_cpu(conn->dev, rx->dma_addr, wc->byte_len,
				   DMA_FROM_DEVICE);

	spin_lock_irqsave(&conn->lock, flags);
	cmd = list_first_entry_or_null(&conn->free_cmds, struct istx_cmd, node);
	if (cmd)
		list_del_init(&cmd->node);
	spin_unlock_irqrestore(&conn->lock, flags);

	/* the core copies the PDU, the descriptor can go straight back */
	if (cmd)
		istx_core_submit(cmd, rx->buf, wc->byte_len);
	if (istx_post_recv(conn, rx))
		pr_err("istx: failed to re-post receive\n");
}

static void istx_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct istx_cmd *cmd = container_of(wc->wr_cqe, struct istx_cmd, read_cqe);
	struct istx_conn *conn = cmd->conn;

	rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			    cmd->sg_cnt, DMA_FROM_DEVICE);
	cmd->rw_live = false;
	istx_core_data_out_done(cmd, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}

/* Data-Out: pull the initiator's buffer. */
int istx_get_data_out(struct istx_cmd *cmd)
{
	struct istx_conn *conn = cmd->conn;
	int ret;

	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			       cmd->sg_cnt, 0, cmd->remote_addr, cmd->rkey,
			       DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	cmd->rw_live = true;
	cmd->read_cqe.done = istx_read_done;
	ret = rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->port_num, &cmd->read_cqe, NULL); // OK: rdma-unsignaled-send-starvation -- with a cqe the core signals the last READ
	if (ret) {
		rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
				    cmd->sg_cnt, DMA_FROM_DEVICE);
		cmd->rw_live = false;
	}
	return ret;
}

/* Data-In and the SCSI response in one chain, or the response alone. */
int istx_queue_response(struct istx_cmd *cmd, bool data_in)
{
	struct istx_conn *conn = cmd->conn;
	int ret;

	istx_prep_tx(conn, &cmd->tx, istx_send_done);
	if (!data_in)
		return ib_post_send(conn->qp, &cmd->tx.send_wr, NULL);

	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			       cmd->sg_cnt, 0, cmd->remote_addr, cmd->rkey,
			       DMA_TO_DEVICE);
	if (ret < 0)
		return ret;
	cmd->rw_live = true;
	ret = rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->port_num, NULL,
			       &cmd->tx.send_wr); // OK: rdma-unsignaled-send-starvation -- the chained response SEND carries IB_SEND_SIGNALED from istx_prep_tx()
	if (ret) {
		rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
				    cmd->sg_cnt, DMA_TO_DEVICE);
		cmd->rw_live = false;
	}
	return ret;
}

static void istx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct istx_cmd *cmd = container_of(wc->wr_cqe, struct istx_cmd, tx.cqe);
	struct istx_conn *conn = cmd->conn;
	unsigned long flags;

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("istx: send failed: %s\n", ib_wc_status_msg(wc->status));
	if (cmd->rw_live) {
		rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
				    cmd->sg_cnt, DMA_TO_DEVICE);
		cmd->rw_live = false;
	}
	istx_core_release(cmd);
	spin_lock_irqsave(&conn->lock, flags);
	list_add_tail(&cmd->node, &conn->free_cmds);
	spin_unlock_irqrestore(&conn->lock, flags);
}

static void istx_nopin_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_warn("istx: NOP-In failed: %s\n", ib_wc_status_msg(wc->status));
}

static void istx_keepalive_work(struct work_struct *work)
{
	struct istx_conn *conn = container_of(to_delayed_work(work),
					      struct istx_conn, keepalive);
	struct istx_tx_desc *tx = &conn->nopin_tx;

	istx_build_nopin(conn, tx->hdr);
	istx_prep_tx(conn, tx, istx_nopin_done);
	/* keepalives need no completion, except now and then to free the SQ */
	tx->send_wr.send_flags = 0;
	if (atomic_read(&conn->nopin_unsignaled) >= ISTX_NOPIN_SIG_EVERY) { // BUG: rdma-unsignaled-send-starvation -- nopin_unsignaled is only ever reset with atomic_set(), never counted up
		tx->send_wr.send_flags |= IB_SEND_SIGNALED;
		atomic_set(&conn->nopin_unsignaled, 0);
	}
	if (ib_post_send(conn->qp, &tx->send_wr, NULL))
		pr_warn("istx: NOP-In post failed\n");
	queue_delayed_work(system_wq, &conn->keepalive,
			   msecs_to_jiffies(ISTX_NOPIN_MS));
}

void istx_conn_teardown(struct istx_conn *conn)
{
	int i;

	cancel_delayed_work_sync(&conn->keepalive);
	rdma_disconnect(conn->cm_id);
	ib_drain_qp(conn->qp);

	for (i = 0; i < ISTX_RX_RING; i++)
		ib_dma_unmap_single(conn->dev, conn->rx_descs[i].dma_addr,
				    sizeof(conn->rx_descs[i].buf), DMA_FROM_DEVICE);
	ib_dma_unmap_single(conn->dev, conn->nopin_tx.dma_addr, ISTX_HDR_LEN,
			    DMA_TO_DEVICE);
	rdma_destroy_qp(conn->cm_id);
	ib_cq_pool_put(conn->cq, conn->cq_size);
	ib_dealloc_pd(conn->pd);
	kfree(conn->rx_descs);
	kfree(conn->cmds);
	rdma_destroy_id(conn->cm_id);
	kfree(conn);
}

int istx_connect_request(struct rdma_cm_id *cm_id)
{
	struct istx_conn *conn;
	int i, ret;

	conn = kzalloc(sizeof(*conn), GFP_KERNEL);
	if (!conn)
		return -ENOMEM;
	conn->cm_id = cm_id;
	conn->dev = cm_id->device;
	conn->port_num = cm_id->port_num;
	INIT_LIST_HEAD(&conn->free_cmds);
	spin_lock_init(&conn->lock);
	atomic_set(&conn->nopin_unsignaled, 0);
	INIT_DELAYED_WORK(&conn->keepalive, istx_keepalive_work);

	conn->pd = ib_alloc_pd(conn->dev, 0);
	if (IS_ERR(conn->pd)) {
		ret = PTR_ERR(conn->pd);
		goto out_free;
	}
	ret = istx_create_qp(conn);
	if (ret)
		goto out_pd;

	conn->cmds = kcalloc(ISTX_CMDS_MAX, sizeof(*conn->cmds), GFP_KERNEL);
	if (!conn->cmds) {
		ret = -ENOMEM;
		goto out_qp;
	}
	for (i = 0; i < ISTX_CMDS_MAX; i++) {
		conn->cmds[i].conn = conn;
		list_add_tail(&conn->cmds[i].node, &conn->free_cmds);
	}
	conn->nopin_tx.dma_addr = ib_dma_map_single(conn->dev, conn->nopin_tx.hdr,
						    ISTX_HDR_LEN, DMA_TO_DEVICE);
	ret = istx_alloc_rx_ring(conn);
	if (ret)
		goto out_cmds;

	cm_id->context = conn;
	queue_delayed_work(system_wq, &conn->keepalive,
			   msecs_to_jiffies(ISTX_NOPIN_MS));
	return 0;

out_cmds:
	kfree(conn->cmds);
out_qp:
	rdma_destroy_qp(cm_id);
	ib_cq_pool_put(conn->cq, conn->cq_size);
out_pd:
	ib_dealloc_pd(conn->pd);
out_free:
	kfree(conn);
	return ret;
}

MODULE_DESCRIPTION("istx iSER-style target transport");
MODULE_LICENSE("GPL");
