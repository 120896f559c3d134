// SPDX-License-Identifier: GPL-2.0
/*
 * nbdx_target.c - RDMA queue of the NBDX network block target.
 *
 * The target moves data itself rather than through rdma_rw: for a client
 * WRITE it registers the command's pages with an MR from the queue's pool
 * and pulls the data with an RDMA READ chained behind the REG_MR; once the
 * READ completed the MR is invalidated and returned from the LOCAL_INV
 * completion.  Writes of at most one page are pulled into the queue's
 * bounce page, registered once at queue setup.  For a client READ the
 * pages are pushed with an RDMA WRITE chained in front of the response.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

/* REG_MR, the RDMA READ or WRITE, and the LOCAL_INV or the response */
#define NBDX_WRS_PER_IO		3
#define NBDX_MAX_SGE		4
#define NBDX_MAX_PAGES		128

struct nbdx_rsp {
	__le32	handle;
	__le32	error;
};

struct nbdx_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			port_num;
	int			depth;
	struct ib_mr		*bounce_mr;
	struct scatterlist	bounce_sg;
	struct ib_reg_wr	bounce_reg_wr;
	struct workqueue_struct	*wq;
};

struct nbdx_cmd {
	struct nbdx_queue	*queue;
	struct ib_cqe		rdma_cqe, inv_cqe, rsp_cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	rdma_wr;
	struct ib_send_wr	inv_wr, rsp_wr;
	struct ib_sge		rdma_sge, rsp_sge;
	struct ib_mr		*mr;
	struct scatterlist	*sg;
	int			nents;
	u64			remote_addr;
	u32			remote_key;
	u32			len;
	struct nbdx_rsp		*rsp;
	u64			rsp_dma;
	struct work_struct	exec_work;
};

int nbdx_create_queue_ib(struct nbdx_queue *queue)
{
	struct ib_qp_init_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	/* BUG: rdma-send-queue-manual-factor -- the per-I/O work request count is kept by hand */
	attr.cap.max_send_wr = NBDX_WRS_PER_IO * queue->depth + 1; /* OK: rdma-send-queue-undersized -- REG_MR+READ, then LOCAL_INV or response: three per I/O, plus the drain */
	attr.cap.max_recv_wr = queue->depth + 1;
	attr.cap.max_send_sge = NBDX_MAX_SGE; /* OK: rdma-queue-cap-unchecked -- four SGEs are within what every device offers */
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = attr.recv_cq = queue->cq;
	ret = rdma_create_qp(queue->cm_id, queue->pd, &attr);
	if (ret)
		return ret;
	queue->qp = queue->cm_id->qp;

	/* BUG: rdma-local-mr-management -- the target keeps its own MR pool */
	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->depth,
			      IB_MR_TYPE_MEM_REG, NBDX_MAX_PAGES, 0);
	if (ret)
		rdma_destroy_qp(queue->cm_id);
	return ret;
}

/* The bounce page is registered once, for local access only. */
int nbdx_setup_bounce(struct nbdx_queue *queue)
{
	struct ib_reg_wr *reg = &queue->bounce_reg_wr;
	int n, ret;

	/* BUG: rdma-local-mr-management -- MR allocated by the ULP */
	queue->bounce_mr = ib_alloc_mr(queue->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- kept by the queue that owns the QP, allocated once at setup */
	if (IS_ERR(queue->bounce_mr))
		return PTR_ERR(queue->bounce_mr);
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(queue->bounce_mr, &queue->bounce_sg, 1, NULL, PAGE_SIZE);
	if (n != 1) {
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(queue->bounce_mr); /* OK: rdma-mr-leak -- released on the failed mapping */
		return -EINVAL;
	}
	memset(reg, 0, sizeof(*reg));
	reg->wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	reg->mr = queue->bounce_mr; /* OK: rdma-rkey-reuse -- the bounce MR is registered once, for the queue's lifetime */
	reg->key = queue->bounce_mr->rkey;
	reg->access = IB_ACCESS_LOCAL_WRITE;
	ret = ib_post_send(queue->qp, &reg->wr, NULL);
	if (ret) {
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(queue->bounce_mr); /* OK: rdma-mr-leak, rdma-registration-in-datapath -- released when the post fails; a queue-owned MR, released at setup */
		queue->bounce_mr = NULL;
	}
	return ret;
}

static void nbdx_release_mr(struct nbdx_cmd *cmd)
{
	struct nbdx_queue *queue = cmd->queue;

	ib_dma_unmap_sg(queue->dev, cmd->sg, cmd->nents, DMA_FROM_DEVICE);
	/* BUG: rdma-local-mr-management -- pool put by the ULP */
	ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, cmd->mr);
	cmd->mr = NULL;
}

static void nbdx_rsp_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nbdx_cmd *cmd = container_of(wc->wr_cqe, struct nbdx_cmd, rsp_cqe);

	kfree(cmd->rsp);
	kfree(cmd); /* OK: rdma-mr-leak -- cmd->mr was returned and cleared before any response is sent */
}

static void nbdx_build_rsp(struct nbdx_cmd *cmd, int error)
{
	cmd->rsp->error = cpu_to_le32(error);
	cmd->rsp_sge.addr = cmd->rsp_dma;
	cmd->rsp_sge.length = sizeof(*cmd->rsp);
	cmd->rsp_sge.lkey = cmd->queue->pd->local_dma_lkey;
	cmd->rsp_cqe.done = nbdx_rsp_done;
	cmd->rsp_wr.next = NULL;
	cmd->rsp_wr.wr_cqe = &cmd->rsp_cqe;
	cmd->rsp_wr.sg_list = &cmd->rsp_sge;
	cmd->rsp_wr.num_sge = 1;
	cmd->rsp_wr.opcode = IB_WR_SEND;
	cmd->rsp_wr.send_flags = IB_SEND_SIGNALED;
}

static int nbdx_send_rsp(struct nbdx_cmd *cmd, int error)
{
	nbdx_build_rsp(cmd, error);
	return ib_post_send(cmd->queue->qp, &cmd->rsp_wr, NULL);
}

static void nbdx_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nbdx_cmd *cmd = container_of(wc->wr_cqe, struct nbdx_cmd, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("nbdx: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the completion of its LOCAL_INV */
	nbdx_release_mr(cmd);
	queue_work(cmd->queue->wq, &cmd->exec_work);
}

static void nbdx_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nbdx_cmd *cmd = container_of(wc->wr_cqe, struct nbdx_cmd, rdma_cqe);
	struct nbdx_queue *queue = cmd->queue;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("nbdx: RDMA READ failed: %s\n", ib_wc_status_msg(wc->status));
		/* BUG: rdma-invalidation-leak -- a failed READ skips the LOCAL_INV and the sink MR goes back to the pool still registered */
		nbdx_release_mr(cmd);
		nbdx_send_rsp(cmd, -EIO);
		return;
	}

	cmd->inv_cqe.done = nbdx_inv_done;
	cmd->inv_wr.next = NULL;
	cmd->inv_wr.wr_cqe = &cmd->inv_cqe;
	cmd->inv_wr.num_sge = 0;
	cmd->inv_wr.opcode = IB_WR_LOCAL_INV;
	cmd->inv_wr.send_flags = IB_SEND_SIGNALED;
	cmd->inv_wr.ex.invalidate_rkey = cmd->mr->rkey;
	if (ib_post_send(queue->qp, &cmd->inv_wr, NULL))
		pr_err("nbdx: cannot post LOCAL_INV, queue needs recovery\n");
}

static void nbdx_read_small_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nbdx_cmd *cmd = container_of(wc->wr_cqe, struct nbdx_cmd, rdma_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		nbdx_send_rsp(cmd, -EIO);
	else
		queue_work(cmd->queue->wq, &cmd->exec_work);
}

/* Client WRITE: pull the data into the command's pages. */
int nbdx_rdma_read_data(struct nbdx_cmd *cmd)
{
	struct nbdx_queue *queue = cmd->queue;
	int n, ret, access;
	u8 key;

	if (!ib_dma_map_sg(queue->dev, cmd->sg, cmd->nents, DMA_FROM_DEVICE))
		return -EIO;
	/* BUG: rdma-local-mr-management -- pool MR taken by the ULP */
	cmd->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!cmd->mr) {
		ib_dma_unmap_sg(queue->dev, cmd->sg, cmd->nents, DMA_FROM_DEVICE);
		return -EAGAIN;
	}
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(cmd->mr, cmd->sg, cmd->nents, NULL, PAGE_SIZE);
	if (n < cmd->nents) {
		nbdx_release_mr(cmd); /* OK: rdma-mr-leak -- returned to the pool on the failed mapping */
		return -EINVAL;
	}

	key = (u8)(cmd->mr->rkey & 0xff);
	ib_update_fast_reg_key(cmd->mr, key++);

	access = IB_ACCESS_LOCAL_WRITE;
	if (rdma_protocol_iwarp(queue->dev, queue->port_num))
		access |= IB_ACCESS_REMOTE_WRITE; // BUG: rdma-access-flags-transport -- the iWARP READ-sink rule is repeated with an inline transport test

	memset(&cmd->reg_wr, 0, sizeof(cmd->reg_wr));
	cmd->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	cmd->reg_wr.wr.next = &cmd->rdma_wr.wr;
	cmd->reg_wr.mr = cmd->mr; // BUG: rdma-rkey-reuse -- key++ hands ib_update_fast_reg_key() the key the MR already has
	cmd->reg_wr.key = cmd->mr->rkey;
	cmd->reg_wr.access = access; /* OK: rdma-remote-access-overbroad -- remote write on an iWARP READ sink is required */

	cmd->rdma_sge.addr = cmd->mr->iova;
	cmd->rdma_sge.length = cmd->len;
	cmd->rdma_sge.lkey = cmd->mr->lkey;
	cmd->rdma_cqe.done = nbdx_read_done;
	cmd->rdma_wr.wr.next = NULL;
	cmd->rdma_wr.wr.wr_cqe = &cmd->rdma_cqe;
	cmd->rdma_wr.wr.sg_list = &cmd->rdma_sge;
	cmd->rdma_wr.wr.num_sge = 1;
	cmd->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	cmd->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmd->rdma_wr.remote_addr = cmd->remote_addr;
	cmd->rdma_wr.rkey = cmd->remote_key;

	ret = ib_post_send(queue->qp, &cmd->reg_wr.wr, NULL);
	if (unlikely(ret)) {
		ib_dma_unmap_sg(queue->dev, cmd->sg, cmd->nents, DMA_FROM_DEVICE);
		return ret; // BUG: rdma-mr-leak -- the pool MR stays in cmd->mr, never put back
	}
	return 0;
}

/* Client WRITE of at most a page: pull it into the bounce page. */
int nbdx_rdma_read_small(struct nbdx_cmd *cmd)
{
	struct nbdx_queue *queue = cmd->queue;

	cmd->rdma_sge.addr = queue->bounce_mr->iova;
	cmd->rdma_sge.length = min_t(u32, cmd->len, PAGE_SIZE);
	cmd->rdma_sge.lkey = queue->bounce_mr->lkey;
	cmd->rdma_cqe.done = nbdx_read_small_done;
	cmd->rdma_wr.wr.next = NULL;
	cmd->rdma_wr.wr.wr_cqe = &cmd->rdma_cqe;
	cmd->rdma_wr.wr.sg_list = &cmd->rdma_sge;
	cmd->rdma_wr.wr.num_sge = 1;
	cmd->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	cmd->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmd->rdma_wr.remote_addr = cmd->remote_addr;
	cmd->rdma_wr.rkey = cmd->remote_key;
	/* BUG: rdma-access-flags-transport -- the bounce MR was registered with local write only; an iWARP READ response cannot be placed in it */
	return ib_post_send(queue->qp, &cmd->rdma_wr.wr, NULL);
}

/* Client READ: push the pages, then the response, in one chain. */
int nbdx_rdma_write_data(struct nbdx_cmd *cmd)
{
	struct nbdx_queue *queue = cmd->queue;
	int count;

	count = ib_dma_map_sg(queue->dev, cmd->sg, cmd->nents, DMA_TO_DEVICE);
	if (count != 1)
		return -EINVAL;
	nbdx_build_rsp(cmd, 0);

	cmd->rdma_sge.addr = sg_dma_address(cmd->sg);
	cmd->rdma_sge.length = sg_dma_len(cmd->sg);
	cmd->rdma_sge.lkey = queue->pd->local_dma_lkey;
	cmd->rdma_wr.wr.next = &cmd->rsp_wr;
	cmd->rdma_wr.wr.wr_cqe = NULL;
	cmd->rdma_wr.wr.sg_list = &cmd->rdma_sge;
	cmd->rdma_wr.wr.num_sge = 1;
	cmd->rdma_wr.wr.opcode = IB_WR_RDMA_WRITE;
	cmd->rdma_wr.wr.send_flags = 0;
	cmd->rdma_wr.remote_addr = cmd->remote_addr;
	cmd->rdma_wr.rkey = cmd->remote_key;
	/* OK: rdma-access-flags-transport -- an RDMA WRITE source needs no remote rights on any transport */
	return ib_post_send(queue->qp, &cmd->rdma_wr.wr, NULL);
}

/* The client went away: give the command's pages back to the backend. */
void nbdx_abort_cmd(struct nbdx_cmd *cmd)
{
	struct nbdx_queue *queue = cmd->queue;

	if (!cmd->mr)
		return;
	cmd->inv_cqe.done = nbdx_inv_done;
	cmd->inv_wr.next = NULL;
	cmd->inv_wr.wr_cqe = &cmd->inv_cqe;
	cmd->inv_wr.num_sge = 0;
	cmd->inv_wr.opcode = IB_WR_LOCAL_INV;
	cmd->inv_wr.send_flags = 0;
	cmd->inv_wr.ex.invalidate_rkey = cmd->mr->rkey;
	if (!ib_post_send(queue->qp, &cmd->inv_wr, NULL))
		/* BUG: rdma-unmap-before-invalidate -- the sink pages and the MR are released right behind the unsignaled LOCAL_INV */
		nbdx_release_mr(cmd);
}

void nbdx_destroy_queue_ib(struct nbdx_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	/* BUG: rdma-local-mr-management -- deregistration by the ULP */
	ib_dereg_mr(queue->bounce_mr);
	rdma_destroy_qp(queue->cm_id);
}
