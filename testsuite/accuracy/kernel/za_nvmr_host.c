// SPDX-License-Identifier: GPL-2.0
/*
 * za_nvmr_host.c - host side of an NVMe-over-RDMA style transport queue.
 *
 * Every data-bearing command takes an MR from the QP's MR pool
 * (qp->rdma_mrs), maps the request's scatterlist into it under a fresh
 * key and chains the REG_MR in front of the command capsule SEND.  The
 * request holds two references: one dropped by the SEND completion, one
 * by the response.  A response that came with SEND_WITH_INV is checked
 * against the request's rkey (a mismatch starts error recovery); any
 * other response is followed by a signaled LOCAL_INV whose completion
 * ends the request.
 *
 * Correct here: the I/O mapping helper, the response handler, the
 * LOCAL_INV completion, unwinding after a failed post.
 * Not correct: the helper that maps the buffer of a synchronous
 * (connect/property) command reuses the pooled MR's key and loses the MR
 * on a short map; the synchronous command gives its MR back on timeout;
 * the keep-alive abort path recycles requests right after posting their
 * LOCAL_INV.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed for this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define ZN_SYNC_TIMEOUT_MS	3000
#define ZN_MAX_PAGES		256
#define ZN_SGL_KEYED		0x40
#define ZN_SGL_INVALIDATE	0x0f
#define ZN_SC_ABORT_REQ		0x07
#define ZN_SC_HOST_PATH_ERROR	0x370

struct zn_keyed_sgl {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct zn_cmd {
	u8			opcode;
	u8			flags;
	u16			command_id;
	__le32			nsid;
	u64			rsvd;
	struct zn_keyed_sgl	dptr;
	__le32			cdw10[6];
};

struct zn_rsp {
	__le32	result;
	__le32	rsvd;
	__le16	sq_head;
	__le16	sq_id;
	u16	command_id;
	u16	status;
};

struct zn_ctrl {
	struct work_struct	err_work;
	bool			deleting;
};

struct zn_request;

struct zn_queue {
	struct zn_ctrl		*ctrl;
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	int			queue_size;
	struct zn_request	*reqs;		/* indexed by command_id */
};

struct zn_request {
	struct zn_queue		*queue;
	struct zn_cmd		*cmd;
	u64			cmd_dma;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct sg_table		sgt;
	struct scatterlist	sync_sg;
	int			nents;
	enum dma_data_direction	dir;
	atomic_t		ref;
	u16			status;
	bool			in_flight;
	struct completion	done;
	void			(*end_io)(struct zn_request *req, u16 status);
};

static void zn_error_recovery(struct zn_ctrl *ctrl)
{
	if (ctrl->deleting)
		return;
	queue_work(system_wq, &ctrl->err_work);
}

static void zn_wr_error(struct zn_queue *queue, struct ib_wc *wc,
			const char *op)
{
	pr_err("%s for CQE 0x%p failed with status %s (%d)\n", op,
	       wc->wr_cqe, ib_wc_status_msg(wc->status), wc->status);
	zn_error_recovery(queue->ctrl);
}

static void zn_set_keyed_sgl(struct zn_keyed_sgl *sg, u64 addr, u32 len,
			     u32 key, bool inval)
{
	sg->addr = cpu_to_le64(addr);
	put_unaligned_le24(len, sg->length);
	put_unaligned_le32(key, sg->key);
	sg->type = (ZN_SGL_KEYED << 4) | (inval ? ZN_SGL_INVALIDATE : 0);
}

static void zn_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zn_request *req =
		container_of(wc->wr_cqe, struct zn_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		zn_wr_error(req->queue, wc, "MEMREG");
}

static void zn_unmap_data(struct zn_queue *queue, struct zn_request *req)
{
	if (!req->nents)
		return;

	if (req->mr) {
		/* OK: rdma-invalidation-leak -- reached once the key is dead (checked remote or completed local invalidation) or was never posted */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->dev, req->sgt.sgl, req->nents, req->dir);
	req->nents = 0;
}

static void zn_complete_rq(struct zn_request *req)
{
	zn_unmap_data(req->queue, req);
	req->in_flight = false;
	req->end_io(req, req->status);
}

static void zn_end_request(struct zn_request *req)
{
	if (!atomic_dec_and_test(&req->ref))
		return;
	zn_complete_rq(req);
}

static void zn_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zn_request *req =
		container_of(wc->wr_cqe, struct zn_request, send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zn_wr_error(req->queue, wc, "SEND");
		return;
	}
	zn_end_request(req);
}

static void zn_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zn_request *req =
		container_of(wc->wr_cqe, struct zn_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zn_wr_error(req->queue, wc, "LOCAL_INV");
		return;
	}
	zn_end_request(req);	/* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
}

static int zn_inv_rkey(struct zn_queue *queue, struct zn_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->reg_cqe.done = zn_inv_rkey_done;
	wr.wr_cqe = &req->reg_cqe;

	return ib_post_send(queue->qp, &wr, NULL);
}

static int zn_map_sg_fr(struct zn_queue *queue, struct zn_request *req,
			struct zn_cmd *c, int count)
{
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;

	/*
	 * Align the MR to a 4K page size to match the ctrl page size and
	 * the block virtual boundary.
	 */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		/* OK: rdma-mr-leak -- a short map hands the MR straight back */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		if (nr < 0)
			return nr;
		return -EINVAL;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = zn_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;	/* OK: rdma-rkey-reuse -- key rotated right above */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE |
			     IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	zn_set_keyed_sgl(&c->dptr, req->mr->iova, req->mr->length,
			 req->mr->rkey, true);
	return 0;
}

/*
 * Connect and property commands carry a small kmalloc'ed buffer; map it
 * with its own single-entry scatterlist.
 */
static int zn_map_sync_buf(struct zn_queue *queue, struct zn_request *req,
			   void *buf, unsigned int len)
{
	int nr;

	sg_init_one(&req->sync_sg, buf, len);
	req->sgt.sgl = &req->sync_sg;
	req->sgt.nents = 1;
	req->dir = DMA_FROM_DEVICE;
	req->nents = ib_dma_map_sg(queue->dev, req->sgt.sgl, 1, req->dir);
	if (!req->nents)
		return -EIO;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!req->mr) {
		nr = -EAGAIN;
		goto out_unmap;
	}

	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, req->nents, NULL, SZ_4K);
	if (nr != req->nents) {
		nr = nr < 0 ? nr : -EINVAL;
		goto out_unmap;		/* BUG: rdma-mr-leak -- req->mr from ib_mr_pool_get() is not put back on a short map */
	}

	req->reg_cqe.done = zn_memreg_done;
	req->reg_wr.wr.next = NULL;
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.wr.send_flags = 0;
	/* BUG: rdma-rkey-reuse -- pooled MR registered again under the key the previous command advertised */
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	zn_set_keyed_sgl(&req->cmd->dptr, req->mr->iova, len,
			 req->mr->rkey, true);
	return 0;

out_unmap:
	ib_dma_unmap_sg(queue->dev, req->sgt.sgl, 1, req->dir);
	req->nents = 0;
	return nr;
}

static int zn_map_data(struct zn_queue *queue, struct zn_request *req)
{
	int ret;

	req->nents = ib_dma_map_sg(queue->dev, req->sgt.sgl, req->sgt.nents,
				   req->dir);
	if (unlikely(req->nents <= 0))
		return -EIO;

	ret = zn_map_sg_fr(queue, req, req->cmd, req->nents);
	if (ret) {
		ib_dma_unmap_sg(queue->dev, req->sgt.sgl, req->sgt.nents,
				req->dir);
		req->nents = 0;
	}
	return ret;
}

static int zn_post_send(struct zn_queue *queue, struct zn_request *req,
			struct ib_send_wr *first)
{
	req->send_sge.addr = req->cmd_dma;
	req->send_sge.length = sizeof(struct zn_cmd);
	req->send_sge.lkey = queue->pd->local_dma_lkey;

	req->send_cqe.done = zn_send_done;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &req->send_wr;
	else
		first = &req->send_wr;

	return ib_post_send(queue->qp, first, NULL);
}

int zn_queue_rq(struct zn_queue *queue, struct zn_request *req)
{
	int ret;

	/* one reference for the SEND completion, one for the response */
	atomic_set(&req->ref, 2);
	req->status = 0;

	ret = zn_map_data(queue, req);
	if (unlikely(ret))
		return ret;

	req->in_flight = true;
	ret = zn_post_send(queue, req, req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(ret)) {
		req->in_flight = false;
		zn_unmap_data(queue, req);	/* OK: rdma-invalidation-leak -- the REG_MR failed to post together with the SEND */
		return ret;
	}
	return 0;
}

static void zn_process_rsp(struct zn_queue *queue, struct zn_rsp *rsp,
			   struct ib_wc *wc)
{
	u16 id = rsp->command_id;
	struct zn_request *req;

	if (unlikely(id >= queue->queue_size)) {
		pr_err("response for invalid command id %u\n", id);
		zn_error_recovery(queue->ctrl);
		return;
	}
	req = &queue->reqs[id];
	req->status = rsp->status >> 1;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {	/* BUG: rdma-remote-invalidate-unchecked -- compared, but on a mismatch the request is still completed below (pages unmapped, MR back to the pool) while its own rkey is valid; nvme-rdma returns after the error recovery */
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("Bogus remote invalidation for rkey %#x\n",
			       req->mr ? req->mr->rkey : 0);
			zn_error_recovery(queue->ctrl);
		}
	} else if (req->mr) {
		int ret;

		ret = zn_inv_rkey(queue, req);
		if (unlikely(ret < 0)) {
			pr_err("Queueing INV WR for rkey %#x failed (%d)\n",
			       req->mr->rkey, ret);
			zn_error_recovery(queue->ctrl);
		}
		/* the local invalidation completion will end the request */
		return;		/* OK: rdma-unmap-before-invalidate -- nothing is released until zn_inv_rkey_done() */
	}

	zn_end_request(req);	/* OK: rdma-invalidation-leak -- the invalidated key was checked; on a mismatch error recovery tears the queue and its MR pool down */
}

void zn_recv_done(struct zn_queue *queue, struct zn_rsp *rsp,
		  struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zn_wr_error(queue, wc, "RECV");
		return;
	}
	if (unlikely(wc->byte_len < sizeof(*rsp))) {
		pr_err("Unexpected response length %u\n", wc->byte_len);
		zn_error_recovery(queue->ctrl);
		return;
	}
	zn_process_rsp(queue, rsp, wc);
}

static void zn_sync_end_io(struct zn_request *req, u16 status)
{
	complete(&req->done);
}

/*
 * Fabrics connect and property get/set: issued from process context
 * during association, waits for the response.
 */
int zn_submit_sync_cmd(struct zn_queue *queue, struct zn_request *req,
		       void *buf, unsigned int len)
{
	unsigned long left;
	int ret;

	init_completion(&req->done);
	req->end_io = zn_sync_end_io;
	req->status = 0;
	atomic_set(&req->ref, 2);

	ret = zn_map_sync_buf(queue, req, buf, len);
	if (ret)
		return ret;

	req->in_flight = true;
	ret = zn_post_send(queue, req, &req->reg_wr.wr);
	if (ret)
		goto out_unmap;		/* OK: rdma-invalidation-leak -- the chain with the REG_MR was not posted */

	left = wait_for_completion_timeout(&req->done,
			msecs_to_jiffies(ZN_SYNC_TIMEOUT_MS));
	if (!left) {
		pr_warn("sync command %u timed out\n",
			req->cmd->command_id);
		ret = -ETIMEDOUT;
		goto out_unmap;		/* BUG: rdma-invalidation-leak -- the target got the rkey with the command; the MR returns to the pool still valid */
	}
	return req->status ? -EIO : 0;

out_unmap:
	req->in_flight = false;
	zn_unmap_data(queue, req);
	return ret;
}

/*
 * Keep-alive expired on a queue that is still connected: fence the keys
 * of everything in flight and fail it back to the caller.
 */
void zn_abort_inflight(struct zn_queue *queue)
{
	int i;

	for (i = 0; i < queue->queue_size; i++) {
		struct zn_request *req = &queue->reqs[i];

		if (!req->in_flight)
			continue;
		if (req->mr)
			zn_inv_rkey(queue, req);
		req->status = ZN_SC_HOST_PATH_ERROR;
		zn_complete_rq(req);	/* BUG: rdma-unmap-before-invalidate -- MR back in the pool and SG unmapped while the LOCAL_INV just posted is outstanding */
	}
}

int zn_create_queue_ib(struct zn_queue *queue, int pages_per_mr)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.cap.max_send_wr = 3 * queue->queue_size + 1;
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;
	init_attr.qp_context = queue;

	ret = rdma_create_qp(queue->cm_id, queue->pd, &init_attr);
	if (ret)
		return ret;
	queue->qp = queue->cm_id->qp;

	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs,
			      queue->queue_size, IB_MR_TYPE_MEM_REG,
			      min_t(int, pages_per_mr, ZN_MAX_PAGES), 0);
	if (ret) {
		pr_err("failed to initialize MR pool sized %d\n",
		       queue->queue_size);
		rdma_destroy_qp(queue->cm_id);
		queue->qp = NULL;
		return ret;
	}
	return 0;
}

void zn_destroy_queue_ib(struct zn_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	queue->qp = NULL;
}

MODULE_DESCRIPTION("NVMe-over-RDMA style host queue");
MODULE_LICENSE("GPL");
