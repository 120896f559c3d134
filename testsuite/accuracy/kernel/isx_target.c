// SPDX-License-Identifier: GPL-2.0
/*
 * isx_target.c - RDMA data mover of the ISX block target.
 *
 * Commands arrive as SENDs into a receive ring posted at connection setup.
 * Data-in is moved with the core's rdma_rw contexts (RDMA WRITE chained in
 * front of the response SEND); data-out is pulled with rdma_rw READs, or,
 * for payloads that fit one page, with a single RDMA READ into the
 * command's bounce page.  The response may carry a remote invalidation of
 * the initiator's key when the initiator asked for it.  NOP-In keepalives
 * are sent from the same QP.
 *
 * Command lifetime is reference counted; the last reference tears down the
 * rdma_rw context and frees the command.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/mm.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define ISX_MAX_CMDS		128
#define ISX_QP_MAX_RECV_DTOS	2048
#define ISX_MAX_SGE		16
#define ISX_MAX_PAGES		256
#define ISX_INLINE_RSP		128
#define ISX_NOPIN_BATCH		16

struct isx_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*device;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			port_num;
	u32			max_inline;
	u32			rw_max_sge;
	unsigned int		nopin_since_signal;
	struct ib_cqe		nopin_cqe;
	struct ib_send_wr	nopin_wr;
	struct ib_sge		nopin_sge;
	struct workqueue_struct	*wq;
};

struct isx_cmd {
	struct isx_conn		*conn;
	atomic_t		ref;
	void			(*release)(struct isx_cmd *cmd);
	struct rdma_rw_ctx	rw;
	bool			rw_valid;
	struct scatterlist	*sg;
	u32			sg_cnt;
	enum dma_data_direction	dir;
	u64			remote_va;
	u32			remote_rkey;
	u32			inv_rkey;
	bool			send_inv;
	struct ib_cqe		rdma_cqe;
	struct ib_cqe		rsp_cqe;
	struct ib_send_wr	rsp_wr;
	struct ib_sge		rsp_sge;
	struct ib_rdma_wr	read_wr;
	struct ib_sge		read_sge;
	void			*bounce;
	u64			bounce_dma;
	u32			data_len;
	struct work_struct	exec_work;
};

static void isx_cmd_release(struct isx_cmd *cmd)
{
	struct isx_conn *conn = cmd->conn;

	if (cmd->rw_valid)
		/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the rdma_rw core owns these MRs and invalidates them itself */
		rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num,
				    cmd->sg, cmd->sg_cnt, cmd->dir);
	if (cmd->bounce_dma)
		ib_dma_unmap_single(conn->device, cmd->bounce_dma, PAGE_SIZE,
				    DMA_FROM_DEVICE);
	kfree(cmd->bounce);
	kfree(cmd);
}

static inline void isx_cmd_put(struct isx_cmd *cmd)
{
	if (atomic_dec_and_test(&cmd->ref))
		cmd->release(cmd);
}

int isx_create_qp(struct isx_conn *conn)
{
	struct ib_device *device = conn->device;
	struct ib_qp_init_attr attr;
	unsigned int factor;
	int ret;

	factor = rdma_rw_mr_factor(device, conn->port_num, ISX_MAX_PAGES);
	/* OK: rdma-access-flags-transport -- the transport test picks an SGE limit, not access rights */
	conn->rw_max_sge = rdma_protocol_iwarp(device, conn->port_num) ?
			   device->attrs.max_sge_rd : device->attrs.max_send_sge;

	memset(&attr, 0, sizeof(attr));
	attr.event_handler = NULL;
	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- one response SEND per command plus the drain; rdma_rw adds its READ/WRITE and MR work requests from max_rdma_ctxs */
	attr.cap.max_send_wr = ISX_MAX_CMDS + 1;
	attr.cap.max_rdma_ctxs = ISX_MAX_CMDS * factor;
	/* BUG(file): rdma-queue-cap-unchecked -- 2048 receives requested without a look at attrs.max_qp_wr */
	attr.cap.max_recv_wr = ISX_QP_MAX_RECV_DTOS;
	/* OK: rdma-queue-cap-unchecked -- the SGE count is clamped to the device */
	attr.cap.max_send_sge = min_t(u32, ISX_MAX_SGE, device->attrs.max_send_sge);
	attr.cap.max_recv_sge = 1;
	/* OK: rdma-queue-cap-unchecked -- the granted inline size is read back below */
	attr.cap.max_inline_data = ISX_INLINE_RSP;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.port_num = conn->port_num;

	ret = rdma_create_qp(conn->cm_id, conn->pd, &attr);
	if (ret) {
		pr_err("isx: rdma_create_qp failed: %d\n", ret);
		return ret;
	}
	conn->qp = conn->cm_id->qp;
	conn->max_inline = attr.cap.max_inline_data;
	return 0;
}

void isx_destroy_qp(struct isx_conn *conn)
{
	ib_drain_qp(conn->qp);
	rdma_destroy_qp(conn->cm_id);
}

static void isx_rsp_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isx_cmd *cmd = container_of(wc->wr_cqe, struct isx_cmd, rsp_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("isx: response failed: %s\n", ib_wc_status_msg(wc->status));
	isx_cmd_put(cmd);
}

static void isx_build_rsp(struct isx_cmd *cmd, void *rsp, u32 len)
{
	struct ib_send_wr *wr = &cmd->rsp_wr;

	cmd->rsp_sge.addr = (uintptr_t)rsp;
	cmd->rsp_sge.length = len;
	cmd->rsp_sge.lkey = cmd->conn->pd->local_dma_lkey;

	cmd->rsp_cqe.done = isx_rsp_done;
	wr->next = NULL;
	wr->wr_cqe = &cmd->rsp_cqe;
	wr->sg_list = &cmd->rsp_sge;
	wr->num_sge = 1;
	if (cmd->send_inv) {
		wr->opcode = IB_WR_SEND_WITH_INV;
		wr->ex.invalidate_rkey = cmd->inv_rkey;
	} else {
		wr->opcode = IB_WR_SEND;
	}
	wr->send_flags = IB_SEND_SIGNALED;
	if (len <= cmd->conn->max_inline)
		wr->send_flags |= IB_SEND_INLINE;
}

/* Data-in: RDMA WRITE the payload, then the response. */
int isx_queue_data_in(struct isx_cmd *cmd, void *rsp, u32 rsp_len)
{
	struct isx_conn *conn = cmd->conn;
	int ret;

	/* OK: rdma-local-mr-management -- the core maps and registers the data */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			       cmd->sg_cnt, 0, cmd->remote_va, cmd->remote_rkey,
			       DMA_TO_DEVICE);
	if (ret < 0)
		return ret;
	cmd->rw_valid = true;
	cmd->dir = DMA_TO_DEVICE;

	isx_build_rsp(cmd, rsp, rsp_len);
	atomic_inc(&cmd->ref);
	ret = rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->port_num, NULL,
			       &cmd->rsp_wr);
	if (ret)
		isx_cmd_put(cmd);
	return ret;
}

static void isx_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isx_cmd *cmd = container_of(wc->wr_cqe, struct isx_cmd, rdma_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("isx: data-out READ failed: %s\n", ib_wc_status_msg(wc->status));
		isx_cmd_put(cmd);
		return;
	}
	queue_work(cmd->conn->wq, &cmd->exec_work);
}

/* Data-out larger than a page: let the core build the READs. */
int isx_get_data_out(struct isx_cmd *cmd)
{
	struct isx_conn *conn = cmd->conn;
	int ret;

	/* OK: rdma-access-flags-transport -- rdma_rw gives an iWARP READ sink the rights it needs */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			       cmd->sg_cnt, 0, cmd->remote_va, cmd->remote_rkey,
			       DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	cmd->rw_valid = true;
	cmd->dir = DMA_FROM_DEVICE;
	cmd->rdma_cqe.done = isx_rdma_read_done;
	return rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->port_num,
				&cmd->rdma_cqe, NULL);
}

/* Data-out that fits one page: a single READ into the bounce page. */
int isx_get_small_data_out(struct isx_cmd *cmd)
{
	struct isx_conn *conn = cmd->conn;

	cmd->bounce = kmalloc(PAGE_SIZE, GFP_KERNEL);
	if (!cmd->bounce)
		return -ENOMEM;
	cmd->bounce_dma = ib_dma_map_single(conn->device, cmd->bounce,
					    PAGE_SIZE, DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(conn->device, cmd->bounce_dma)) {
		cmd->bounce_dma = 0;
		return -EIO;
	}

	cmd->read_sge.addr = cmd->bounce_dma;
	cmd->read_sge.length = cmd->data_len;
	cmd->read_sge.lkey = conn->pd->local_dma_lkey;

	cmd->rdma_cqe.done = isx_rdma_read_done;
	cmd->read_wr.wr.next = NULL;
	cmd->read_wr.wr.wr_cqe = &cmd->rdma_cqe;
	cmd->read_wr.wr.sg_list = &cmd->read_sge;
	cmd->read_wr.wr.num_sge = 1;
	cmd->read_wr.wr.opcode = IB_WR_RDMA_READ;
	cmd->read_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmd->read_wr.remote_addr = cmd->remote_va;
	cmd->read_wr.rkey = cmd->remote_rkey;
	/* BUG: rdma-access-flags-transport -- the READ sink is addressed with local_dma_lkey, which has no remote write; on iWARP the READ response cannot be placed */
	return ib_post_send(conn->qp, &cmd->read_wr.wr, NULL);
}

/* Status-only response: a plain SEND from the command's response buffer. */
int isx_send_status(struct isx_cmd *cmd, void *rsp, u32 rsp_len)
{
	isx_build_rsp(cmd, rsp, rsp_len);
	/* OK: rdma-unsignaled-send-starvation -- isx_build_rsp() always asks for a completion */
	return ib_post_send(cmd->conn->qp, &cmd->rsp_wr, NULL);
}

static void isx_nopin_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR))
		pr_err("isx: NOP-In failed: %s\n", ib_wc_status_msg(wc->status));
}

int isx_post_nopin(struct isx_conn *conn, void *pdu, u32 len)
{
	struct ib_send_wr *wr = &conn->nopin_wr;

	conn->nopin_sge.addr = (uintptr_t)pdu;
	conn->nopin_sge.length = len;
	conn->nopin_sge.lkey = conn->pd->local_dma_lkey;

	conn->nopin_cqe.done = isx_nopin_done;
	wr->next = NULL;
	wr->wr_cqe = &conn->nopin_cqe;
	wr->sg_list = &conn->nopin_sge;
	wr->num_sge = 1;
	wr->opcode = IB_WR_SEND;
	wr->send_flags = IB_SEND_INLINE;
	/* BUG(file): rdma-unsignaled-send-starvation -- nopin_since_signal is only ever reset, so a NOP-In is never signaled */
	if (conn->nopin_since_signal >= ISX_NOPIN_BATCH) {
		wr->send_flags |= IB_SEND_SIGNALED;
		conn->nopin_since_signal = 0;
	}
	return ib_post_send(conn->qp, wr, NULL);
}

void isx_abort_cmd(struct isx_cmd *cmd)
{
	isx_cmd_put(cmd);
}

struct isx_cmd *isx_alloc_cmd(struct isx_conn *conn)
{
	struct isx_cmd *cmd = kzalloc(sizeof(*cmd), GFP_KERNEL);

	if (!cmd)
		return NULL;
	cmd->conn = conn;
	cmd->release = isx_cmd_release;
	atomic_set(&cmd->ref, 1);
	return cmd;
}

MODULE_DESCRIPTION("ISX RDMA block target data mover");
MODULE_LICENSE("GPL v2");
