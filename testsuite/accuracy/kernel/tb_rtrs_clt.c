// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * tb_rtrs_clt.c - RDMA transport client (rtrs style): request table, read
 * registration and response handling of one path.
 *
 * Every permit of a path owns an I/O request with its own fast-registration
 * MR. A READ maps the caller's pages, registers them with a REG_MR chained
 * in front of the RDMA_WRITE_WITH_IMM that places the request message into
 * the server's buffer, and passes the rkey in the message. The server
 * writes the data and answers with SEND_WITH_INV carrying the message id;
 * WRITE requests are answered with an immediate. A READ whose key was not
 * invalidated by the server is invalidated by a signaled LOCAL_INV and
 * finished from its completion.
 *
 * Known problems: the response handler notices an invalidation of a
 * foreign rkey but completes the READ anyway; failing all outstanding
 * requests on a path error drops the invalidation; the abort path unmaps
 * right after posting its LOCAL_INV; the send queue reserves two WRs per
 * request and forgets the LOCAL_INV; the MR resize after a reconnect
 * drops the old MR.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-rkey-reuse, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define rtrs_err(fmt, ...)  pr_err("rtrs-clt: " fmt, ##__VA_ARGS__)
#define rtrs_wrn(fmt, ...)  pr_warn("rtrs-clt: " fmt, ##__VA_ARGS__)

#define RTRS_WRS_PER_IO		2	/* REG_MR + RDMA_WRITE_WITH_IMM */
#define MAX_PATH_MSG_ID		0xffff

struct rtrs_sg_desc {
	__le64	addr;
	__le32	key;
	__le32	len;
};

struct rtrs_msg_rdma_read {
	__le32			type;
	__le32			usr_len;
	__le32			sg_cnt;
	struct rtrs_sg_desc	desc[1];
};

struct rtrs_msg_rsp {
	__le32	msg_id;
	__le32	errno;
};

struct rtrs_clt_path;
struct rtrs_clt_con;

struct rtrs_iu {
	struct ib_cqe		cqe;
	void			*buf;
	u64			dma_addr;
	u32			size;
	struct rtrs_clt_con	*con;
};

struct rtrs_clt_con {
	struct rtrs_clt_path	*clt_path;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	unsigned int		cid;
};

struct rtrs_clt_io_req {
	struct rtrs_clt_con	*con;
	struct rtrs_iu		*iu;
	struct ib_sge		*sge;
	struct scatterlist	*sglist;
	unsigned int		sg_cnt;
	unsigned int		data_len;
	enum dma_data_direction	dir;
	struct ib_mr		*mr;
	u32			mr_max_pages;
	struct ib_cqe		inv_cqe;
	bool			need_inv;
	bool			in_use;
	int			inv_errno;
	void			*priv;
	void			(*conf)(void *priv, int errno);
};

struct rtrs_clt_path {
	struct ib_device	*ib_dev;
	struct ib_pd		*pd;
	struct rtrs_clt_con	**con;
	u32			queue_depth;
	u32			max_pages_per_mr;
	struct rtrs_clt_io_req	*reqs;
	u64			*rbufs;
	u32			rbuf_rkey;
	struct work_struct	err_recovery_work;
};

static void rtrs_clt_path_error(struct rtrs_clt_path *clt_path)
{
	queue_work(system_wq, &clt_path->err_recovery_work);
}

static void free_path_reqs(struct rtrs_clt_path *clt_path)
{
	struct rtrs_clt_io_req *req;
	int i;

	if (!clt_path->reqs)
		return;
	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		if (req->mr)
			ib_dereg_mr(req->mr); /* OK: rdma-invalidation-leak -- deregistration kills the key */
		kfree(req->sge);
	}
	kfree(clt_path->reqs);
	clt_path->reqs = NULL;
}

int alloc_path_reqs(struct rtrs_clt_path *clt_path)
{
	struct rtrs_clt_io_req *req;
	int i, err = -ENOMEM;

	clt_path->reqs = kcalloc(clt_path->queue_depth,
				 sizeof(*clt_path->reqs), GFP_KERNEL);
	if (!clt_path->reqs)
		return -ENOMEM;

	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		req->sge = kcalloc(2, sizeof(*req->sge), GFP_KERNEL);
		if (!req->sge)
			goto out;

		req->mr = ib_alloc_mr(clt_path->pd, IB_MR_TYPE_MEM_REG,
				      clt_path->max_pages_per_mr);
		if (IS_ERR(req->mr)) {
			err = PTR_ERR(req->mr);
			req->mr = NULL;
			goto out;
		}
		req->mr_max_pages = clt_path->max_pages_per_mr;
	}
	return 0;

out:
	free_path_reqs(clt_path); /* OK: rdma-mr-leak -- every MR allocated so far is deregistered there */
	return err;
}

/* after a reconnect the server may allow larger I/O: grow the MRs */
void rtrs_clt_resize_mrs(struct rtrs_clt_path *clt_path, u32 max_pages)
{
	struct rtrs_clt_io_req *req;
	struct ib_mr *mr;
	int i;

	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		if (req->mr && req->mr_max_pages >= max_pages)
			continue;

		mr = ib_alloc_mr(clt_path->pd, IB_MR_TYPE_MEM_REG, max_pages);
		if (IS_ERR(mr)) {
			rtrs_wrn("keeping %u-page MR for req %d\n",
				 req->mr_max_pages, i);
			continue;
		}
		req->mr = mr; /* BUG: rdma-mr-leak -- the smaller MR this slot held is overwritten without ib_dereg_mr() */
		req->mr_max_pages = max_pages;
	}
	clt_path->max_pages_per_mr = max_pages;
}

static void rtrs_clt_req_release(struct rtrs_clt_io_req *req)
{
	struct rtrs_clt_path *clt_path = req->con->clt_path;

	if (req->sg_cnt)
		ib_dma_unmap_sg(clt_path->ib_dev, req->sglist, req->sg_cnt,
				req->dir);
	req->in_use = false;
	req->con = NULL;
}

static void complete_rdma_req(struct rtrs_clt_io_req *req, int errno);

static void rtrs_clt_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rtrs_clt_io_req *req =
		container_of(wc->wr_cqe, struct rtrs_clt_io_req, inv_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		rtrs_err("failed IB_WR_LOCAL_INV: %s\n",
			 ib_wc_status_msg(wc->status));
		rtrs_clt_path_error(req->con->clt_path);
		return;
	}
	req->need_inv = false;
	complete_rdma_req(req, req->inv_errno); /* OK: rdma-invalidation-leak -- the LOCAL_INV succeeded */
}

static int rtrs_inv_rkey(struct rtrs_clt_io_req *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = &req->inv_cqe,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = rtrs_clt_inv_rkey_done;
	return ib_post_send(req->con->qp, &wr, NULL);
}

static void complete_rdma_req(struct rtrs_clt_io_req *req, int errno)
{
	int err;

	if (WARN_ON(!req->in_use))
		return;

	if (req->sg_cnt && req->dir == DMA_FROM_DEVICE && req->need_inv) {
		/*
		 * The server did not invalidate the read buffer; do it
		 * ourselves and finish from the LOCAL_INV completion.
		 */
		req->inv_errno = errno;
		err = rtrs_inv_rkey(req);
		if (err) {
			rtrs_err("send INV WR key=%#x: %d\n", req->mr->rkey, err);
			rtrs_clt_path_error(req->con->clt_path);
		}
		/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- nothing is released until the LOCAL_INV completes */
		return;
	}

	rtrs_clt_req_release(req); /* OK: rdma-invalidation-leak -- reached for reads only after the key was invalidated */
	if (req->conf)
		req->conf(req->priv, errno);
}

int rtrs_clt_read_req(struct rtrs_clt_con *con, struct rtrs_clt_io_req *req,
		      u32 buf_id)
{
	struct rtrs_clt_path *clt_path = con->clt_path;
	struct rtrs_msg_rdma_read *msg = req->iu->buf;
	struct ib_rdma_wr imm_wr = {};
	struct ib_reg_wr rwr = {};
	struct ib_send_wr *wr;
	int count = 0, nr, ret;

	req->con = con;
	req->in_use = true;
	req->need_inv = false;
	msg->sg_cnt = cpu_to_le32(req->sg_cnt ? 1 : 0);

	imm_wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	imm_wr.wr.wr_cqe = &req->iu->cqe;
	imm_wr.wr.send_flags = IB_SEND_SIGNALED;
	imm_wr.wr.sg_list = req->sge;
	imm_wr.wr.num_sge = 1;
	imm_wr.wr.ex.imm_data = cpu_to_be32(buf_id);
	imm_wr.remote_addr = clt_path->rbufs[buf_id];
	imm_wr.rkey = clt_path->rbuf_rkey;
	req->sge[0].addr = req->iu->dma_addr;
	req->sge[0].length = sizeof(*msg);
	req->sge[0].lkey = clt_path->pd->local_dma_lkey;
	wr = &imm_wr.wr;

	if (req->sg_cnt) {
		count = ib_dma_map_sg(clt_path->ib_dev, req->sglist,
				      req->sg_cnt, req->dir);
		if (!count)
			return -EINVAL;

		nr = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
		if (nr != count) {
			ib_dma_unmap_sg(clt_path->ib_dev, req->sglist,
					req->sg_cnt, req->dir); /* OK: rdma-invalidation-leak -- no REG_MR was posted */
			return nr < 0 ? nr : -EINVAL;
		}
		ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

		rwr.wr.opcode = IB_WR_REG_MR;
		rwr.wr.next = &imm_wr.wr;
		rwr.mr = req->mr;
		rwr.key = req->mr->rkey;
		rwr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
		wr = &rwr.wr;

		msg->desc[0].addr = cpu_to_le64(req->mr->iova);
		msg->desc[0].key = cpu_to_le32(req->mr->rkey);
		msg->desc[0].len = cpu_to_le32(req->mr->length);
		req->need_inv = true;
	}

	ret = ib_post_send(con->qp, wr, NULL);
	if (ret) {
		rtrs_err("read request failed: %d\n", ret);
		if (req->sg_cnt)
			ib_dma_unmap_sg(clt_path->ib_dev, req->sglist,
					req->sg_cnt, req->dir); /* OK: rdma-invalidation-leak -- the REG_MR and the message carrying the key failed to post */
		req->need_inv = false;
		req->in_use = false;
	}
	return ret;
}

static void rtrs_clt_handle_rsp(struct rtrs_clt_con *con, struct rtrs_iu *iu,
				struct ib_wc *wc)
{
	struct rtrs_clt_path *clt_path = con->clt_path;
	struct rtrs_msg_rsp *rsp = iu->buf;
	struct rtrs_clt_io_req *req;
	u32 msg_id = le32_to_cpu(rsp->msg_id);

	if (unlikely(msg_id >= clt_path->queue_depth)) {
		rtrs_err("bogus msg_id %u\n", msg_id);
		rtrs_clt_path_error(clt_path);
		return;
	}
	req = &clt_path->reqs[msg_id];

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(wc->ex.invalidate_rkey != req->mr->rkey)) {
			rtrs_wrn("server invalidated rkey %#x, expected %#x\n",
				 wc->ex.invalidate_rkey, req->mr->rkey);
			rtrs_clt_path_error(clt_path);
		}
		/* BUG: rdma-remote-invalidate-unchecked -- on a mismatch the request is still completed as invalidated */
		req->need_inv = false;
	}
	complete_rdma_req(req, (s32)le32_to_cpu(rsp->errno)); /* OK: rdma-invalidation-leak -- the remote invalidation is taken; trusting it on a mismatch is the finding above */
}

void rtrs_clt_rdma_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rtrs_iu *iu = container_of(wc->wr_cqe, struct rtrs_iu, cqe);
	struct rtrs_clt_con *con = iu->con;
	u32 imm;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			rtrs_err("%s\n", ib_wc_status_msg(wc->status));
		rtrs_clt_path_error(con->clt_path);
		return;
	}

	switch (wc->opcode) {
	case IB_WC_RECV_RDMA_WITH_IMM:
		/* write response: msg id in the immediate, nothing registered */
		imm = be32_to_cpu(wc->ex.imm_data);
		complete_rdma_req(&con->clt_path->reqs[imm & MAX_PATH_MSG_ID],
				  (imm >> 16) ? -EIO : 0);
		break;
	case IB_WC_RECV:
		rtrs_clt_handle_rsp(con, iu, wc);
		break;
	default:
		break;
	}
}

/* path error: fail every request still in flight */
void rtrs_clt_fail_all_reqs(struct rtrs_clt_path *clt_path)
{
	struct rtrs_clt_io_req *req;
	int i;

	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		if (!req->in_use)
			continue;
		/* the path is going away, don't bother invalidating */
		req->need_inv = false;
		complete_rdma_req(req, -ECONNRESET); /* BUG: rdma-invalidation-leak -- READ buffers go back to the caller with their rkeys valid; the PD is shared with the other paths */
	}
}

/* block layer timed out a READ: revoke the server's access and give the pages back */
int rtrs_clt_abort_req(struct rtrs_clt_io_req *req)
{
	int err;

	if (!req->in_use)
		return 0;
	if (req->need_inv) {
		err = rtrs_inv_rkey(req);
		if (err)
			return err;
		req->need_inv = false;
	}
	rtrs_clt_req_release(req); /* BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is signaled but nothing waits for it before the unmap */
	if (req->conf)
		req->conf(req->priv, -ETIMEDOUT);
	return 0;
}

int create_con_cq_qp(struct rtrs_clt_con *con)
{
	struct rtrs_clt_path *clt_path = con->clt_path;
	struct ib_qp_init_attr init_attr = {};
	u32 max_send_wr, cq_num;
	int err;

	/* BUG(file): rdma-send-queue-undersized -- a READ posts REG_MR, RDMA_WRITE_WITH_IMM and later a LOCAL_INV */
	max_send_wr = RTRS_WRS_PER_IO * clt_path->queue_depth + 1; /* BUG(file): rdma-send-queue-manual-factor -- hand-made per-I/O factor that includes the registration */
	cq_num = max_send_wr + clt_path->queue_depth;

	con->cq = ib_cq_pool_get(clt_path->ib_dev, cq_num, con->cid,
				 IB_POLL_SOFTIRQ);
	if (IS_ERR(con->cq))
		return PTR_ERR(con->cq);

	init_attr.cap.max_send_wr = max_send_wr;
	init_attr.cap.max_recv_wr = clt_path->queue_depth;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.qp_context = con;
	init_attr.send_cq = con->cq;
	init_attr.recv_cq = con->cq;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;

	err = rdma_create_qp(con->cm_id, clt_path->pd, &init_attr);
	if (err) {
		ib_cq_pool_put(con->cq, cq_num);
		return err;
	}
	con->qp = con->cm_id->qp;
	return 0;
}

void destroy_con_cq_qp(struct rtrs_clt_con *con, u32 cq_num)
{
	ib_drain_qp(con->qp);
	rdma_destroy_qp(con->cm_id);
	con->qp = NULL;
	ib_cq_pool_put(con->cq, cq_num);
}

MODULE_LICENSE("GPL");
