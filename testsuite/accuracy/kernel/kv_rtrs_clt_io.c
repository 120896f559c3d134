// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * kv_rtrs_clt_io.c - RDMA transport client, I/O request path (RTRS style).
 *
 * Every request slot of a path owns one fast-registration MR for its whole
 * life.  READ: the client registers its buffer for remote write, puts the
 * rkey in the read message it RDMA-writes (with immediate) into the
 * server's receive chunk, and flags it "needs invalidation"; the server
 * answers with SEND_WITH_INV whose payload names the request, then an
 * RDMA_WRITE_WITH_IMM carrying the status.  The client accepts the
 * invalidation only when the invalidated rkey is the request's, and
 * otherwise posts a signaled LOCAL_INV from the completion path.  WRITE:
 * the MR only gathers a long scatterlist for the client's own RDMA WRITE
 * (local access, the key never leaves the host).
 *
 * Known problems kept in this file:
 *  - the READ path rotates the key only when the last invalidation was
 *    local, so a remotely invalidated key is registered again as is;
 *  - a LOCAL_INV that fails to post, or completes in error, still lets the
 *    request finish and its buffer be unmapped;
 *  - renegotiating the MR size drops the old MRs.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-unsignaled-send-starvation -- not the subject of this module; per-request MRs are manual FRWR management by design
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define RTC_MSG_READ		1
#define RTC_MSG_WRITE		2
#define RTC_MSG_NEED_INVAL_F	1
#define RTC_IO_REQ_IMM		0
#define RTC_IO_RSP_IMM		1
#define RTC_IMM_TYPE_SHIFT	26
#define RTC_IMM_PAYLOAD_MASK	((1U << RTC_IMM_TYPE_SHIFT) - 1)

struct rtc_sg_desc {
	__le64	addr;
	__le32	key;
	__le32	len;
};

struct rtc_msg_rdma_read {
	u16			type;
	u16			usr_len;
	u16			flags;
	u16			sg_cnt;
	struct rtc_sg_desc	desc[];
};

struct rtc_msg_rkey_rsp {
	u16	type;
	u16	msg_id;
};

struct rtc_con;

struct rtc_iu {
	struct ib_cqe	cqe;
	void		*buf;
	u64		dma_addr;
	u32		size;
	struct rtc_con	*con;
};

struct rtc_io_req {
	struct rtc_con		*con;
	struct rtc_iu		*iu;
	struct ib_mr		*mr;
	struct ib_sge		*sge;
	struct ib_cqe		inv_cqe;
	struct completion	inv_comp;
	struct scatterlist	*sglist;
	unsigned int		sg_cnt;
	unsigned int		usr_len;
	unsigned int		mem_id;
	enum dma_data_direction	dir;
	bool			in_use;
	bool			need_inv;
	bool			need_inv_comp;
	bool			inv_by_us;
	int			inv_errno;
	void			*priv;
	void			(*conf)(void *priv, int errno);
};

struct rtc_path {
	struct ib_device	*ib_dev;
	struct ib_pd		*pd;
	struct rtc_con		*con;
	struct rtc_io_req	*reqs;
	unsigned int		queue_depth;
	unsigned int		max_pages_per_mr;
	u64			rbuf_addr;
	u32			rbuf_rkey;
	u32			chunk_size;
	struct work_struct	err_recovery_work;
};

struct rtc_con {
	struct ib_qp		*qp;
	struct rtc_path		*path;
};

/* session layer (another unit) */
struct rtc_iu *rtc_iu_alloc(struct rtc_path *path, size_t size);
void rtc_iu_free(struct rtc_iu *iu, struct rtc_path *path);
int rtc_post_recv_empty(struct rtc_con *con, struct ib_cqe *cqe);

static void rtc_error_recovery(struct rtc_con *con)
{
	schedule_work(&con->path->err_recovery_work);
}

static void rtc_fast_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("Failed IB_WR_REG_MR: %s\n", ib_wc_status_msg(wc->status));
}

static struct ib_cqe rtc_fast_reg_cqe = {
	.done = rtc_fast_reg_done,
};

/* ---------------- request slots ---------------- */

static void rtc_free_reqs(struct rtc_path *path)
{
	unsigned int i;

	if (!path->reqs)
		return;
	for (i = 0; i < path->queue_depth; ++i) {
		struct rtc_io_req *req = &path->reqs[i];

		if (req->mr)
			ib_dereg_mr(req->mr);	/* OK: rdma-invalidation-leak -- deregistration kills any key still out */
		kfree(req->sge);
		if (req->iu)
			rtc_iu_free(req->iu, path);
	}
	kfree(path->reqs);
	path->reqs = NULL;
}

static int rtc_alloc_reqs(struct rtc_path *path)
{
	struct rtc_io_req *req;
	unsigned int i;
	int err = -ENOMEM;

	path->reqs = kcalloc(path->queue_depth, sizeof(*path->reqs),
			     GFP_KERNEL);
	if (!path->reqs)
		return -ENOMEM;

	for (i = 0; i < path->queue_depth; ++i) {
		req = &path->reqs[i];
		req->mem_id = i;
		req->iu = rtc_iu_alloc(path, path->chunk_size);
		if (!req->iu)
			goto out;

		req->sge = kcalloc(2, sizeof(*req->sge), GFP_KERNEL);
		if (!req->sge)
			goto out;

		req->mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG,
				      path->max_pages_per_mr);
		if (IS_ERR(req->mr)) {
			err = PTR_ERR(req->mr);
			req->mr = NULL;	/* OK: rdma-mr-leak -- an error pointer, not an MR */
			pr_err("Failed to alloc path->max_pages_per_mr %d\n",
			       path->max_pages_per_mr);
			goto out;
		}
		init_completion(&req->inv_comp);
	}
	return 0;

out:
	rtc_free_reqs(path);	/* OK: rdma-mr-leak -- deregisters every MR allocated so far */
	return err;
}

/* The server granted a different max_pages_per_mr on reconnect. */
static int rtc_realloc_mrs(struct rtc_path *path, unsigned int new_pages)
{
	unsigned int i;
	struct ib_mr *mr;

	for (i = 0; i < path->queue_depth; i++) {
		struct rtc_io_req *req = &path->reqs[i];

		if (WARN_ON(req->in_use))
			return -EBUSY;

		mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG, new_pages);
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		req->mr = mr;	/* BUG: rdma-mr-leak -- the MR sized for the old session is overwritten, never deregistered */
	}
	path->max_pages_per_mr = new_pages;
	return 0;
}

static struct rtc_io_req *rtc_get_req(struct rtc_path *path)
{
	unsigned int i;

	for (i = 0; i < path->queue_depth; i++) {
		struct rtc_io_req *req = &path->reqs[i];

		if (!req->in_use) {
			req->in_use = true;
			req->con = path->con;
			return req;
		}
	}
	return NULL;
}

/* ---------------- completion of a request ---------------- */

static void rtc_complete_req(struct rtc_io_req *req, int errno, bool notify,
			     bool can_wait);

static void rtc_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rtc_io_req *req = container_of(wc->wr_cqe, struct rtc_io_req,
					      inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("Failed IB_WR_LOCAL_INV: %s\n",
		       ib_wc_status_msg(wc->status));
		rtc_error_recovery(req->con);
	}
	req->need_inv = false;
	if (req->need_inv_comp)
		complete(&req->inv_comp);
	else
		/* complete request from INV callback */
		rtc_complete_req(req, req->inv_errno, true, false);	/* BUG: rdma-invalidation-leak -- also reached when the LOCAL_INV failed or was flushed: the buffer is unmapped and the slot recycled with the key alive */
}

static int rtc_inv_rkey(struct rtc_io_req *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = &req->inv_cqe,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = rtc_inv_rkey_done;
	req->inv_by_us = true;
	return ib_post_send(req->con->qp, &wr, NULL);
}

static void rtc_complete_req(struct rtc_io_req *req, int errno, bool notify,
			     bool can_wait)
{
	struct rtc_path *path;
	int err;

	if (WARN_ON(!req->in_use))
		return;
	if (WARN_ON(!req->con))
		return;
	path = req->con->path;

	if (req->sg_cnt) {
		if (req->need_inv) {
			/*
			 * The server normally invalidates read buffers with
			 * SEND_WITH_INV; we get here on failover or when it
			 * did not, and invalidate ourselves.
			 */
			if (can_wait)
				req->need_inv_comp = true;
			else
				req->inv_errno = errno;

			err = rtc_inv_rkey(req);
			if (err) {
				pr_err("Send INV WR key=%#x: %d\n",
				       req->mr->rkey, err);
			} else if (can_wait) {
				wait_for_completion(&req->inv_comp);
			} else {
				/* finishes from rtc_inv_rkey_done() */
				return;
			}
		}
		/* BUG: rdma-invalidation-leak -- when rtc_inv_rkey() fails to post, the error is logged and the buffer unmapped with the server's key still valid */
		ib_dma_unmap_sg(path->ib_dev, req->sglist, req->sg_cnt,
				req->dir);	/* OK: rdma-unmap-before-invalidate -- a posted LOCAL_INV is waited for, or the request finishes in its completion */
	}
	req->need_inv_comp = false;
	req->con = NULL;
	req->in_use = false;
	if (notify)
		req->conf(req->priv, errno);
}

static void rtc_process_io_rsp(struct rtc_con *con, u32 msg_id, int errno)
{
	struct rtc_path *path = con->path;

	if (WARN_ON(msg_id >= path->queue_depth))
		return;
	rtc_complete_req(&path->reqs[msg_id], errno, true, false);	/* OK: rdma-invalidation-leak -- invalidates first unless the server's checked SEND_WITH_INV already did */
}

static void rtc_rkey_rsp_done(struct rtc_con *con, struct rtc_iu *iu,
			      u32 inv_rkey)
{
	struct rtc_path *path = con->path;
	struct rtc_msg_rkey_rsp *msg = iu->buf;
	struct rtc_io_req *req;

	if (unlikely(msg->msg_id >= path->queue_depth)) {
		pr_err("rkey response for bogus msg_id %u\n", msg->msg_id);
		rtc_error_recovery(con);
		return;
	}
	req = &path->reqs[msg->msg_id];
	if (unlikely(!req->need_inv || inv_rkey != req->mr->rkey)) {
		pr_err("server invalidated rkey %#x, request %u holds %#x\n",
		       inv_rkey, msg->msg_id, req->mr->rkey);
		rtc_error_recovery(con);
		return;
	}
	req->need_inv = false;
	req->inv_by_us = false;
}

static void rtc_rdma_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rtc_iu *iu = container_of(wc->wr_cqe, struct rtc_iu, cqe);
	struct rtc_con *con = iu->con;
	u32 imm, msg_id;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR) {
			pr_err("RDMA failed: %s\n", ib_wc_status_msg(wc->status));
			rtc_error_recovery(con);
		}
		return;
	}

	switch (wc->opcode) {
	case IB_WC_RECV_RDMA_WITH_IMM:
		imm = be32_to_cpu(wc->ex.imm_data);
		if ((imm >> RTC_IMM_TYPE_SHIFT) == RTC_IO_RSP_IMM) {
			msg_id = (imm & RTC_IMM_PAYLOAD_MASK) >> 1;
			rtc_process_io_rsp(con, msg_id, (imm & 1) ? -EIO : 0);
		}
		break;
	case IB_WC_RECV:
		/* SEND_WITH_INV from the server: the payload names the request */
		if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
			rtc_rkey_rsp_done(con, iu, wc->ex.invalidate_rkey);	/* OK: rdma-remote-invalidate-unchecked -- rtc_rkey_rsp_done() compares the key with the request's */
		break;
	default:
		pr_warn("Unexpected WC type: %d\n", wc->opcode);
		return;
	}
	rtc_post_recv_empty(con, &iu->cqe);
}

/* ---------------- submission ---------------- */

static int rtc_post_rdma(struct rtc_io_req *req, struct ib_sge *sge,
			 int num_sge, u32 imm, struct ib_send_wr *head)
{
	struct rtc_con *con = req->con;
	struct rtc_path *path = con->path;
	struct ib_rdma_wr wr = {};

	wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	wr.wr.wr_cqe = &req->iu->cqe;
	wr.wr.sg_list = sge;
	wr.wr.num_sge = num_sge;
	wr.wr.ex.imm_data = cpu_to_be32(imm);
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.remote_addr = path->rbuf_addr + (u64)req->mem_id * path->chunk_size;
	wr.rkey = path->rbuf_rkey;

	if (head) {
		head->next = &wr.wr;
		return ib_post_send(con->qp, head, NULL);
	}
	return ib_post_send(con->qp, &wr.wr, NULL);
}

static int rtc_read_req(struct rtc_io_req *req)
{
	struct rtc_path *path = req->con->path;
	struct rtc_msg_rdma_read *msg = req->iu->buf;
	struct ib_send_wr *wr = NULL;
	struct ib_reg_wr rwr;
	int ret, nr, count = 0;

	if (req->sg_cnt) {
		count = ib_dma_map_sg(path->ib_dev, req->sglist, req->sg_cnt,
				      req->dir);
		if (unlikely(!count))
			return -EINVAL;
	}

	msg->type = RTC_MSG_READ;
	msg->usr_len = req->usr_len;

	if (count) {
		nr = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
		if (nr != count) {
			ib_dma_unmap_sg(path->ib_dev, req->sglist, req->sg_cnt,
					req->dir);	/* OK: rdma-invalidation-leak -- nothing was registered for this request */
			return nr < 0 ? nr : -EINVAL;
		}
		/*
		 * A key the server invalidated with SEND_WITH_INV is dead
		 * already; only a key we invalidated ourselves needs a bump.
		 */
		if (req->inv_by_us)
			ib_update_fast_reg_key(req->mr,
					       ib_inc_rkey(req->mr->rkey));

		memset(&rwr, 0, sizeof(rwr));
		rwr.wr.opcode = IB_WR_REG_MR;
		rwr.wr.wr_cqe = &rtc_fast_reg_cqe;
		rwr.mr = req->mr;	/* BUG: rdma-rkey-reuse -- after a remote invalidation the MR is registered again under the key the server already holds */
		rwr.key = req->mr->rkey;
		rwr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
		wr = &rwr.wr;

		msg->sg_cnt = 1;
		msg->flags = RTC_MSG_NEED_INVAL_F;
		msg->desc[0].addr = cpu_to_le64(req->mr->iova);
		msg->desc[0].key = cpu_to_le32(req->mr->rkey);
		msg->desc[0].len = cpu_to_le32(req->mr->length);
		req->need_inv = true;
	} else {
		msg->sg_cnt = 0;
		msg->flags = 0;
	}

	req->sge[0].addr = req->iu->dma_addr;
	req->sge[0].length = sizeof(*msg) + msg->sg_cnt * sizeof(msg->desc[0]);
	req->sge[0].lkey = path->pd->local_dma_lkey;

	ret = rtc_post_rdma(req, req->sge, 1,
			    (RTC_IO_REQ_IMM << RTC_IMM_TYPE_SHIFT) | req->mem_id,
			    wr);
	if (unlikely(ret)) {
		pr_err("Read request failed: %d\n", ret);
		if (req->sg_cnt)
			ib_dma_unmap_sg(path->ib_dev, req->sglist, req->sg_cnt,
					req->dir);	/* OK: rdma-invalidation-leak -- the post failed: the message carrying the rkey never left */
		req->need_inv = false;
		return ret;
	}
	return 0;
}

static int rtc_write_req(struct rtc_io_req *req)
{
	struct rtc_path *path = req->con->path;
	struct ib_reg_wr rwr;
	int ret, nr, count, num_sge = 0;

	count = ib_dma_map_sg(path->ib_dev, req->sglist, req->sg_cnt, req->dir);
	if (unlikely(!count))
		return -EINVAL;

	if (count > 1) {
		/* gather the pages behind one local key */
		nr = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
		if (nr != count) {
			ib_dma_unmap_sg(path->ib_dev, req->sglist, req->sg_cnt,
					req->dir);	/* OK: rdma-invalidation-leak -- nothing was registered */
			return nr < 0 ? nr : -EINVAL;
		}
		ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

		memset(&rwr, 0, sizeof(rwr));
		rwr.wr.opcode = IB_WR_REG_MR;
		rwr.wr.wr_cqe = &rtc_fast_reg_cqe;
		rwr.mr = req->mr;	/* OK: rdma-rkey-reuse -- rotated just above */
		rwr.key = req->mr->rkey;
		rwr.access = IB_ACCESS_LOCAL_WRITE;

		ret = ib_post_send(req->con->qp, &rwr.wr, NULL);
		if (unlikely(ret)) {
			ib_dma_unmap_sg(path->ib_dev, req->sglist,
					req->sg_cnt, req->dir);	/* OK: rdma-invalidation-leak -- the REG_MR post failed, and it was local-only anyway */
			return ret;
		}
		req->sge[0].addr = req->mr->iova;
		req->sge[0].length = req->mr->length;
		req->sge[0].lkey = req->mr->lkey;
		num_sge = 1;
	} else {
		req->sge[0].addr = sg_dma_address(req->sglist);
		req->sge[0].length = sg_dma_len(req->sglist);
		req->sge[0].lkey = path->pd->local_dma_lkey;
		num_sge = 1;
	}
	req->need_inv = false;

	ret = rtc_post_rdma(req, req->sge, num_sge,
			    (RTC_IO_REQ_IMM << RTC_IMM_TYPE_SHIFT) | req->mem_id,
			    NULL);
	if (unlikely(ret)) {
		pr_err("Write request failed: %d\n", ret);
		ib_dma_unmap_sg(path->ib_dev, req->sglist, req->sg_cnt,
				req->dir);	/* OK: rdma-invalidation-leak -- the MR was registered for local access only; its key never went to the server */
		return ret;
	}
	return 0;
}

static int rtc_submit(struct rtc_path *path, int dir, struct scatterlist *sg,
		      unsigned int sg_cnt, unsigned int usr_len, void *priv,
		      void (*conf)(void *priv, int errno))
{
	struct rtc_io_req *req;
	int err;

	req = rtc_get_req(path);
	if (!req)
		return -EBUSY;

	req->sglist = sg;
	req->sg_cnt = sg_cnt;
	req->usr_len = usr_len;
	req->priv = priv;
	req->conf = conf;
	req->dir = dir == RTC_MSG_READ ? DMA_FROM_DEVICE : DMA_TO_DEVICE;

	err = dir == RTC_MSG_READ ? rtc_read_req(req) : rtc_write_req(req);
	if (err) {
		req->con = NULL;
		req->in_use = false;	/* OK: rdma-invalidation-leak -- the request failed before its key went out */
	}
	return err;
}

static void rtc_fail_all_reqs(struct rtc_path *path)
{
	unsigned int i;

	for (i = 0; i < path->queue_depth; i++) {
		struct rtc_io_req *req = &path->reqs[i];

		if (req->in_use)
			rtc_complete_req(req, -ECONNRESET, true, true);	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- can_wait: rtc_complete_req() waits for its LOCAL_INV before unmapping */
	}
}

struct rtc_clt_ops {
	int (*alloc_reqs)(struct rtc_path *path);
	void (*free_reqs)(struct rtc_path *path);
	int (*realloc_mrs)(struct rtc_path *path, unsigned int new_pages);
	int (*submit)(struct rtc_path *path, int dir, struct scatterlist *sg,
		      unsigned int sg_cnt, unsigned int usr_len, void *priv,
		      void (*conf)(void *priv, int errno));
	void (*fail_all)(struct rtc_path *path);
	void (*rdma_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct rtc_clt_ops rtc_clt_io_ops = {
	.alloc_reqs	= rtc_alloc_reqs,
	.free_reqs	= rtc_free_reqs,
	.realloc_mrs	= rtc_realloc_mrs,
	.submit		= rtc_submit,
	.fail_all	= rtc_fail_all_reqs,
	.rdma_done	= rtc_rdma_done,
};

MODULE_DESCRIPTION("RDMA transport client I/O path");
MODULE_LICENSE("GPL");
