// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * za_rtrs_clt.c - client path of an RTRS-style block transport, with an
 * SMC-style receive buffer that is registered once per path.
 *
 * Every path keeps a table of queue_depth I/O requests, each with its own
 * FR MR (path->reqs[i].mr), handed out by scanning for !in_use.  A READ
 * registers the destination pages under a fresh key and sends the key
 * to the server, which RDMA-writes the data and answers either with a
 * write-with-immediate or with a SEND_WITH_INV of the request's key.
 * When the server did not invalidate the key, the client posts a
 * signaled LOCAL_INV and completes the request from its completion (or
 * waits for it when the caller may sleep).
 *
 * Correct: request table setup and teardown, the READ submission, the
 * response check of the invalidated key (mismatch: log, schedule
 * recovery, invalidate locally), the waiting completion path, the
 * receive buffer's one-time registration and its teardown.
 * Not correct: a LOCAL_INV that failed to post or completed in error
 * still completes the request; error recovery fails every outstanding
 * request back to the block layer while their keys stay valid for the
 * reconnect on the same PD; receive buffer setup loses the MR on a short
 * map, and on a registration timeout frees the buffer under the live key.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed for this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define ZR_MSG_SIZE		512
#define ZR_REG_TMO_MS		5000
#define ZR_MSG_READ		2
#define ZR_IMM_ERR_SHIFT	31

#define zr_err(p, fmt, ...)	pr_err("rtrs-clt path %p: " fmt, (p), ##__VA_ARGS__)

enum zr_path_state {
	ZR_PATH_CONNECTING,
	ZR_PATH_CONNECTED,
	ZR_PATH_RECONNECTING,
	ZR_PATH_CLOSED,
};

struct zr_iu {
	void		*buf;
	u64		dma_addr;
	size_t		size;
	struct ib_cqe	cqe;
};

struct zr_sg_desc {
	__le64	addr;
	__le32	key;
	__le32	len;
};

struct zr_msg_rdma_read {
	__le16			type;
	__le16			usr_len;
	__le32			sg_cnt;
	struct zr_sg_desc	desc[1];
};

struct zr_msg_io_rsp {
	__le32	msg_id;
	__le32	errno;
};

struct zr_path;

struct zr_io_req {
	struct zr_path		*path;
	struct ib_mr		*mr;
	struct zr_iu		*iu;
	struct ib_reg_wr	rwr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_comp;
	struct ib_sge		send_sge;
	struct ib_send_wr	send_wr;
	struct scatterlist	*sglist;
	unsigned int		sg_cnt;
	enum dma_data_direction	dir;
	bool			in_use;
	bool			need_inv;
	bool			need_inv_comp;
	int			inv_errno;
	void			(*conf)(void *priv, int errno);
	void			*priv;
};

struct zr_rx {
	struct zr_path		*path;
	struct zr_iu		iu;
};

struct zr_rmb {
	void			*cpu_addr;
	size_t			len;
	struct scatterlist	sgl;
	struct ib_mr		*mr;
};

struct zr_path {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	spinlock_t		lock;
	enum zr_path_state	state;
	struct zr_io_req	*reqs;
	unsigned int		queue_depth;
	unsigned int		max_pages_per_mr;
	struct work_struct	err_recovery_work;
	struct zr_rmb		*rmb;
	struct ib_reg_wr	rmb_reg_wr;
	struct ib_cqe		rmb_reg_cqe;
	struct completion	rmb_reg_done;
	int			rmb_reg_status;
};

/* rtrs.c, shared with the server side */
struct zr_iu *zr_iu_alloc(struct ib_device *dev, size_t size,
			  enum dma_data_direction dir);
void zr_iu_free(struct zr_iu *iu, struct ib_device *dev);
int zr_post_recv(struct zr_path *path, struct zr_rx *rx);
int zr_reconnect(struct zr_path *path);
int zr_send_rmb_info(struct zr_path *path, u64 addr, u32 rkey, u32 len);

static void zr_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc);

static void zr_schedule_recovery(struct zr_path *path)
{
	unsigned long flags;

	spin_lock_irqsave(&path->lock, flags);
	if (path->state == ZR_PATH_CONNECTED) {
		path->state = ZR_PATH_RECONNECTING;
		queue_work(system_wq, &path->err_recovery_work);
	}
	spin_unlock_irqrestore(&path->lock, flags);
}

static void zr_free_path_reqs(struct zr_path *path)
{
	unsigned int i;

	if (!path->reqs)
		return;
	for (i = 0; i < path->queue_depth; i++) {
		struct zr_io_req *req = &path->reqs[i];

		if (req->mr)
			ib_dereg_mr(req->mr);	/* OK: rdma-invalidation-leak -- deregistration kills the key */
		zr_iu_free(req->iu, path->dev);
	}
	kfree(path->reqs);
	path->reqs = NULL;
}

static int zr_alloc_path_reqs(struct zr_path *path)
{
	struct zr_io_req *req;
	unsigned int i;
	int err = -ENOMEM;

	path->reqs = kcalloc(path->queue_depth, sizeof(*path->reqs),
			     GFP_KERNEL);
	if (!path->reqs)
		return -ENOMEM;

	for (i = 0; i < path->queue_depth; i++) {
		req = &path->reqs[i];
		req->path = path;
		req->mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG,
				      path->max_pages_per_mr);
		if (IS_ERR(req->mr)) {
			err = PTR_ERR(req->mr);
			req->mr = NULL;
			zr_err(path, "Failed to alloc path->max_pages_per_mr %d\n",
			       path->max_pages_per_mr);
			goto out;
		}
		req->iu = zr_iu_alloc(path->dev, ZR_MSG_SIZE, DMA_TO_DEVICE);
		if (!req->iu)
			goto out;	/* OK: rdma-mr-leak -- zr_free_path_reqs() deregisters the MR of every entry, this one included */
		init_completion(&req->inv_comp);
	}
	return 0;

out:
	zr_free_path_reqs(path);
	return err;
}

static struct zr_io_req *zr_get_req(struct zr_path *path)
{
	struct zr_io_req *req = NULL;
	unsigned long flags;
	unsigned int i;

	spin_lock_irqsave(&path->lock, flags);
	for (i = 0; i < path->queue_depth; i++) {
		if (!path->reqs[i].in_use) {
			req = &path->reqs[i];
			req->in_use = true;
			break;
		}
	}
	spin_unlock_irqrestore(&path->lock, flags);
	return req;
}

static void zr_put_req(struct zr_io_req *req)
{
	unsigned long flags;

	spin_lock_irqsave(&req->path->lock, flags);
	req->in_use = false;	/* OK: rdma-invalidation-leak -- callers return a request whose key is dead or was never posted */
	spin_unlock_irqrestore(&req->path->lock, flags);
}

static int zr_inv_rkey(struct zr_io_req *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = &req->inv_cqe,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = zr_inv_rkey_done;
	return ib_post_send(req->path->qp, &wr, NULL);
}

static void zr_complete_rdma_req(struct zr_io_req *req, int errno,
				 bool can_wait)
{
	struct zr_path *path = req->path;
	void (*conf)(void *priv, int errno);
	void *priv;
	int err;

	if (WARN_ON(!req->in_use))
		return;

	if (req->sg_cnt) {
		if (req->dir == DMA_FROM_DEVICE && req->need_inv) {
			/*
			 * The server did not invalidate the key with its
			 * response, or this is a failover: do it ourselves.
			 */
			req->need_inv_comp = can_wait;
			req->inv_errno = errno;
			err = zr_inv_rkey(req);
			if (err) {
				zr_err(path, "Send INV WR key=%#x: %d\n",
				       req->mr->rkey, err);
				zr_schedule_recovery(path);	/* BUG: rdma-invalidation-leak -- the LOCAL_INV was not posted, yet the pages are unmapped and the request recycled below */
			} else if (can_wait) {
				wait_for_completion(&req->inv_comp);	/* OK: rdma-unmap-before-invalidate -- waits for the signaled LOCAL_INV */
			} else {
				/* zr_inv_rkey_done() completes the request */
				return;
			}
		}
		ib_dma_unmap_sg(path->dev, req->sglist, req->sg_cnt, req->dir);
		req->sg_cnt = 0;
	}

	conf = req->conf;
	priv = req->priv;
	zr_put_req(req);
	conf(priv, errno);
}

static void zr_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zr_io_req *req = container_of(wc->wr_cqe, struct zr_io_req,
					     inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zr_err(req->path, "Failed IB_WR_LOCAL_INV: %s\n",
		       ib_wc_status_msg(wc->status));
		zr_schedule_recovery(req->path);
	}
	req->need_inv = false;
	if (req->need_inv_comp)
		complete(&req->inv_comp);
	else
		/* BUG: rdma-invalidation-leak -- also reached when the LOCAL_INV completed in error: the key is still valid */
		zr_complete_rdma_req(req, req->inv_errno, false);
}

static void zr_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zr_io_req *req = container_of(wc->wr_cqe, struct zr_io_req,
					     reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zr_err(req->path, "Failed IB_WR_REG_MR: %s\n",
		       ib_wc_status_msg(wc->status));
		zr_schedule_recovery(req->path);
	}
}

static int zr_read_req(struct zr_io_req *req)
{
	struct zr_path *path = req->path;
	struct zr_msg_rdma_read *msg = req->iu->buf;
	int count, nr, ret;

	count = ib_dma_map_sg(path->dev, req->sglist, req->sg_cnt, req->dir);
	if (unlikely(!count))
		return -EINVAL;

	nr = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
	if (nr != count) {
		ib_dma_unmap_sg(path->dev, req->sglist, req->sg_cnt, req->dir);
		return nr < 0 ? nr : -EINVAL;	/* OK: rdma-mr-leak -- req->mr belongs to the path's request table */
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	memset(&req->rwr, 0, sizeof(req->rwr));
	req->reg_cqe.done = zr_reg_done;
	req->rwr.wr.opcode = IB_WR_REG_MR;
	req->rwr.wr.wr_cqe = &req->reg_cqe;
	req->rwr.wr.next = &req->send_wr;
	req->rwr.mr = req->mr;	/* OK: rdma-rkey-reuse -- key incremented above */
	req->rwr.key = req->mr->rkey;
	req->rwr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	msg->type = cpu_to_le32(ZR_MSG_READ);
	msg->sg_cnt = cpu_to_le32(1);
	msg->desc[0].addr = cpu_to_le64(req->mr->iova);
	msg->desc[0].key = cpu_to_le32(req->mr->rkey);
	msg->desc[0].len = cpu_to_le32(req->mr->length);

	req->send_sge.addr = req->iu->dma_addr;
	req->send_sge.length = sizeof(*msg);
	req->send_sge.lkey = path->pd->local_dma_lkey;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->iu->cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	req->need_inv = true;
	ret = ib_post_send(path->qp, &req->rwr.wr, NULL);
	if (unlikely(ret)) {
		zr_err(path, "Read request failed: error=%d\n", ret);
		req->need_inv = false;
		/* OK: rdma-invalidation-leak -- REG_MR and SEND failed to post together */
		ib_dma_unmap_sg(path->dev, req->sglist, req->sg_cnt, req->dir);
		return ret;
	}
	return 0;
}

int zr_clt_read(struct zr_path *path, struct scatterlist *sg,
		unsigned int sg_cnt, void (*conf)(void *, int), void *priv)
{
	struct zr_io_req *req;
	int err;

	if (path->state != ZR_PATH_CONNECTED)
		return -ECONNRESET;
	req = zr_get_req(path);
	if (!req)
		return -EBUSY;

	req->sglist = sg;
	req->sg_cnt = sg_cnt;
	req->dir = DMA_FROM_DEVICE;
	req->conf = conf;
	req->priv = priv;

	err = zr_read_req(req);
	if (err) {
		req->sg_cnt = 0;
		zr_put_req(req);
	}
	return err;
}

static void zr_process_io_rsp(struct zr_path *path, u32 msg_id, int errno,
			      struct ib_wc *wc)
{
	struct zr_io_req *req;

	if (WARN_ON(msg_id >= path->queue_depth))
		return;
	req = &path->reqs[msg_id];
	if (unlikely(!req->in_use)) {
		zr_err(path, "response for idle request %u\n", msg_id);
		return;
	}

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the request's */
		if (unlikely(wc->ex.invalidate_rkey != req->mr->rkey)) {
			zr_err(path, "server invalidated rkey %#x, expected %#x\n",
			       wc->ex.invalidate_rkey, req->mr->rkey);
			zr_schedule_recovery(path);
		} else {
			req->need_inv = false;
		}
	}
	/* OK: rdma-invalidation-leak -- on a mismatch need_inv stays set and the request posts its own LOCAL_INV */
	zr_complete_rdma_req(req, errno, false);
}

void zr_rdma_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zr_rx *rx = container_of(wc->wr_cqe, struct zr_rx, iu.cqe);
	struct zr_path *path = rx->path;
	struct zr_msg_io_rsp *rsp;
	u32 imm;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR) {
			zr_err(path, "RDMA failed: %s\n",
			       ib_wc_status_msg(wc->status));
			zr_schedule_recovery(path);
		}
		return;
	}

	switch (wc->opcode) {
	case IB_WC_RECV_RDMA_WITH_IMM:
		imm = be32_to_cpu(wc->ex.imm_data);
		zr_process_io_rsp(path, imm & ~(1U << ZR_IMM_ERR_SHIFT),
				  (imm >> ZR_IMM_ERR_SHIFT) ? -EIO : 0, wc);
		break;
	case IB_WC_RECV:
		/* response sent with SEND_WITH_INV: the id is in the payload */
		rsp = rx->iu.buf;
		zr_process_io_rsp(path, le32_to_cpu(rsp->msg_id),
				  -(int)le32_to_cpu(rsp->errno), wc);
		break;
	default:
		zr_err(path, "unexpected opcode %d\n", wc->opcode);
		return;
	}
	zr_post_recv(path, rx);
}

/*
 * The QP went into error and was drained: complete everything in flight
 * with an error so the block layer can fail over to another path.  The
 * request table and its MRs are kept for the reconnect.
 */
static void zr_fail_all_outstanding(struct zr_path *path)
{
	unsigned int i;

	for (i = 0; i < path->queue_depth; i++) {
		struct zr_io_req *req = &path->reqs[i];

		if (!req->in_use)
			continue;
		/* nothing can be posted on a drained QP */
		req->need_inv = false;	/* BUG: rdma-invalidation-leak -- the server holds these keys; they stay valid on the PD while the pages go back and the requests are reused after the reconnect */
		zr_complete_rdma_req(req, -ECONNRESET, false);
	}
}

static void zr_err_recovery_work(struct work_struct *work)
{
	struct zr_path *path = container_of(work, struct zr_path,
					    err_recovery_work);

	ib_drain_qp(path->qp);
	zr_fail_all_outstanding(path);
	if (zr_reconnect(path))
		path->state = ZR_PATH_CLOSED;
}

static int zr_rmb_get_mr(struct zr_path *path, struct zr_rmb *rmb)
{
	int nr;

	rmb->mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG,
			      DIV_ROUND_UP(rmb->len, PAGE_SIZE));
	if (IS_ERR(rmb->mr)) {
		int rc = PTR_ERR(rmb->mr);

		rmb->mr = NULL;
		return rc;	/* OK: rdma-mr-leak -- nothing allocated */
	}

	/* map could be changed, so always update the MR */
	nr = ib_map_mr_sg(rmb->mr, &rmb->sgl, 1, NULL, PAGE_SIZE);
	if (nr != 1)
		return -EINVAL;	/* BUG: rdma-mr-leak -- rmb->mr stays allocated and the caller frees rmb */
	return 0;
}

static void zr_rmb_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zr_path *path = container_of(wc->wr_cqe, struct zr_path,
					    rmb_reg_cqe);

	path->rmb_reg_status = wc->status;
	complete(&path->rmb_reg_done);
}

static int zr_rmb_reg(struct zr_path *path, struct zr_rmb *rmb)
{
	int rc;

	memset(&path->rmb_reg_wr, 0, sizeof(path->rmb_reg_wr));
	path->rmb_reg_cqe.done = zr_rmb_reg_done;
	path->rmb_reg_wr.wr.opcode = IB_WR_REG_MR;
	path->rmb_reg_wr.wr.wr_cqe = &path->rmb_reg_cqe;
	path->rmb_reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	path->rmb_reg_wr.mr = rmb->mr;	/* OK: rdma-rkey-reuse -- the buffer is registered once, for the lifetime of the path */
	path->rmb_reg_wr.key = rmb->mr->rkey;
	path->rmb_reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	init_completion(&path->rmb_reg_done);
	rc = ib_post_send(path->qp, &path->rmb_reg_wr.wr, NULL);
	if (rc)
		return rc;
	if (!wait_for_completion_timeout(&path->rmb_reg_done,
					 msecs_to_jiffies(ZR_REG_TMO_MS)))
		return -ETIMEDOUT;
	return path->rmb_reg_status == IB_WC_SUCCESS ? 0 : -EIO;
}

int zr_rmb_create(struct zr_path *path, size_t len)
{
	struct zr_rmb *rmb;
	int rc = -ENOMEM;

	rmb = kzalloc(sizeof(*rmb), GFP_KERNEL);
	if (!rmb)
		return -ENOMEM;
	rmb->len = len;
	rmb->cpu_addr = kzalloc(len, GFP_KERNEL);
	if (!rmb->cpu_addr)
		goto err_free_rmb;

	sg_init_one(&rmb->sgl, rmb->cpu_addr, len);
	if (!ib_dma_map_sg(path->dev, &rmb->sgl, 1, DMA_FROM_DEVICE)) {
		rc = -EIO;
		goto err_free_buf;
	}

	rc = zr_rmb_get_mr(path, rmb);
	if (rc)
		goto err_unmap;

	rc = zr_rmb_reg(path, rmb);
	/* on a timeout the REG_MR may still be executing: leave the MR alone */
	if (rc == -ETIMEDOUT)
		goto err_unmap;		/* BUG: rdma-invalidation-leak, rdma-mr-leak -- the buffer is unmapped and freed under a live remote-write registration, and rmb->mr is never deregistered */
	if (rc)
		goto err_dereg;

	rc = zr_send_rmb_info(path, rmb->mr->iova, rmb->mr->rkey, len);
	if (rc)
		goto err_dereg;
	path->rmb = rmb;
	return 0;

err_dereg:
	ib_dereg_mr(rmb->mr);
err_unmap:
	ib_dma_unmap_sg(path->dev, &rmb->sgl, 1, DMA_FROM_DEVICE);
err_free_buf:
	kfree(rmb->cpu_addr);
err_free_rmb:
	kfree(rmb);
	return rc;
}

void zr_rmb_destroy(struct zr_path *path)
{
	struct zr_rmb *rmb = path->rmb;

	if (!rmb)
		return;
	ib_dereg_mr(rmb->mr);	/* OK: rdma-invalidation-leak -- deregistered before the buffer is unmapped and freed */
	ib_dma_unmap_sg(path->dev, &rmb->sgl, 1, DMA_FROM_DEVICE);
	kfree(rmb->cpu_addr);
	kfree(rmb);
	path->rmb = NULL;
}

int zr_path_init(struct zr_path *path)
{
	spin_lock_init(&path->lock);
	INIT_WORK(&path->err_recovery_work, zr_err_recovery_work);
	path->state = ZR_PATH_CONNECTING;
	return zr_alloc_path_reqs(path);
}

void zr_path_free(struct zr_path *path)
{
	zr_rmb_destroy(path);
	zr_free_path_reqs(path);
}

MODULE_DESCRIPTION("RTRS-style block transport client path");
MODULE_LICENSE("GPL");
