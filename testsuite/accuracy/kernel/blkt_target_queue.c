// SPDX-License-Identifier: GPL-2.0
/*
 * blkt: queue setup and I/O completion of an invented block-export target
 * ("blkt") that serves a remote initiator's READ and WRITE commands with the
 * core's rdma_rw API.
 *
 * The send queue reserves one SEND per outstanding command and declares
 * cap.max_rdma_ctxs for the rdma_rw contexts, which is right; but it keeps
 * no entry for ib_drain_qp(), which teardown calls, so a full queue hangs the
 * drain. The receive queue is a fixed 4096 entries, more than several RDMA
 * devices accept, and nothing compares it with attrs.max_qp_wr.
 * Registration is left to rdma_rw: no hand-made factor, no MRs of its own.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/completion.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

#define BLKT_RECV_DEPTH		4096
#define BLKT_MAX_PAGES		256
#define BLKT_MSG_SIZE		128

struct blkt_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	u32			depth;
	struct list_head	free_cmds;
	struct completion	drained;
};

struct blkt_cmd {
	struct blkt_queue	*queue;
	struct rdma_rw_ctx	rw;
	struct ib_cqe		rw_cqe;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct scatterlist	*sgl;
	u32			nents;
	enum dma_data_direction	dir;
	struct list_head	entry;
	u64			rsp_dma;
	int			status;
};

void blkt_submit_bio(struct blkt_cmd *cmd);

int blkt_create_qp(struct blkt_queue *q)
{
	struct ib_device *dev = q->cm_id->device;
	struct ib_qp_init_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = q;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- responses are signaled, and rdma_rw_ctx_post() with a cqe signals the READs */
	attr.port_num = q->cm_id->port_num;
	/* BUG: rdma-send-queue-undersized -- one SEND per command but no entry left for the ib_drain_qp() in blkt_destroy_qp() */
	attr.cap.max_send_wr = q->depth; /* OK: rdma-send-queue-manual-factor -- no registration factor; the contexts are declared below */
	attr.cap.max_rdma_ctxs = q->depth *
		rdma_rw_mr_factor(dev, q->cm_id->port_num, BLKT_MAX_PAGES);
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_wr = BLKT_RECV_DEPTH; /* BUG: rdma-queue-cap-unchecked -- 4096 receive WRs requested without looking at attrs.max_qp_wr */
	attr.cap.max_recv_sge = 1;

	ret = rdma_create_qp(q->cm_id, q->pd, &attr);
	if (ret)
		pr_err("blkt: rdma_create_qp failed: %d\n", ret);
	return ret;
}

void blkt_destroy_qp(struct blkt_queue *q)
{
	ib_drain_qp(q->cm_id->qp);
	rdma_destroy_qp(q->cm_id);
}

static void blkt_free_cmd(struct blkt_cmd *cmd)
{
	struct blkt_queue *q = cmd->queue;

	if (cmd->nents) {
		/* OK: rdma-invalidation-leak -- the core's context; its MRs carry no remote rights outside iWARP READ_WITH_INV */
		rdma_rw_ctx_destroy(&cmd->rw, q->cm_id->qp, q->cm_id->port_num,
				    cmd->sgl, cmd->nents, cmd->dir);
		cmd->nents = 0;
	}
	list_add_tail(&cmd->entry, &q->free_cmds);
}

static void blkt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct blkt_cmd *cmd = container_of(wc->wr_cqe, struct blkt_cmd,
					    send_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("blkt: send failed: %s\n", ib_wc_status_msg(wc->status));
	blkt_free_cmd(cmd);
}

static void blkt_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct blkt_cmd *cmd = container_of(wc->wr_cqe, struct blkt_cmd,
					    rw_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		blkt_free_cmd(cmd);
		return;
	}
	blkt_submit_bio(cmd);
}

int blkt_start_write_cmd(struct blkt_cmd *cmd, u64 raddr, u32 rkey)
{
	struct blkt_queue *q = cmd->queue;
	int ret;

	cmd->dir = DMA_FROM_DEVICE;
	/* OK: rdma-local-mr-management, rdma-access-flags-transport -- the READ sink is registered by the core with the rights its transport needs */
	ret = rdma_rw_ctx_init(&cmd->rw, q->cm_id->qp, q->cm_id->port_num,
			       cmd->sgl, cmd->nents, 0, raddr, rkey, cmd->dir);
	if (ret < 0)
		return ret;

	cmd->rw_cqe.done = blkt_read_done;
	ret = rdma_rw_ctx_post(&cmd->rw, q->cm_id->qp, q->cm_id->port_num,
			       &cmd->rw_cqe, NULL);
	if (ret) {
		rdma_rw_ctx_destroy(&cmd->rw, q->cm_id->qp, q->cm_id->port_num,
				    cmd->sgl, cmd->nents, cmd->dir);
		cmd->nents = 0;
	}
	return ret;
}

int blkt_complete_cmd(struct blkt_cmd *cmd, u64 raddr, u32 rkey)
{
	struct blkt_queue *q = cmd->queue;
	struct ib_send_wr *first = &cmd->send_wr;
	int ret;

	cmd->send_sge.addr = cmd->rsp_dma;
	cmd->send_sge.length = BLKT_MSG_SIZE;
	cmd->send_sge.lkey = q->pd->local_dma_lkey;
	cmd->send_cqe.done = blkt_send_done;
	cmd->send_wr.next = NULL;
	cmd->send_wr.wr_cqe = &cmd->send_cqe;
	cmd->send_wr.sg_list = &cmd->send_sge;
	cmd->send_wr.num_sge = 1;
	cmd->send_wr.opcode = IB_WR_SEND;
	cmd->send_wr.send_flags = IB_SEND_SIGNALED;

	if (cmd->dir == DMA_TO_DEVICE && !cmd->status) {
		/* OK: rdma-local-mr-management -- the RDMA WRITEs of the read data are built by rdma_rw */
		ret = rdma_rw_ctx_init(&cmd->rw, q->cm_id->qp,
				       q->cm_id->port_num, cmd->sgl, cmd->nents,
				       0, raddr, rkey, cmd->dir);
		if (ret < 0)
			return ret;
		first = rdma_rw_ctx_wrs(&cmd->rw, q->cm_id->qp,
					q->cm_id->port_num, NULL, &cmd->send_wr);
	}

	ret = ib_post_send(q->cm_id->qp, first, NULL);
	if (ret)
		blkt_free_cmd(cmd);
	return ret;
}
