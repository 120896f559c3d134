// SPDX-License-Identifier: GPL-2.0
/*
 * sb_rtrs_clt.c - RTRS style transport, client I/O path: permits, READ
 * submission with fast registration, response and invalidation handling,
 * and the I/O timeout reaper.
 *
 * The server's SEND_WITH_INV is matched against the permits' rkeys before
 * a permit is considered invalidated; otherwise the client posts its own
 * LOCAL_INV when the response arrives.
 *
 * Problems in this version:
 *  - a failed LOCAL_INV (post or completion) is logged and the permit is
 *    completed anyway, with its rkey still valid;
 *  - the reaper posts an unsignaled LOCAL_INV for a timed-out READ and
 *    recycles the permit without waiting for it.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this program
 */
#include <linux/module.h>
#include <linux/string.h>
#include "sb_rtrs_pri.h"

static void sbr_clt_reg_done(struct ib_cq *cq, struct ib_wc *wc);

static struct ib_cqe sbr_fast_reg_cqe = {
	.done = sbr_clt_reg_done,
};

static struct sbr_clt_io_req *sbr_get_permit(struct sbr_path *path)
{
	struct sbr_clt_io_req *req = NULL;
	unsigned int i;

	spin_lock(&path->lock);
	for (i = 0; i < path->queue_depth; i++) {
		if (!path->reqs[i].in_use) {
			req = &path->reqs[i];
			req->in_use = true;
			break;
		}
	}
	spin_unlock(&path->lock);
	return req;
}

static void sbr_free_req(struct sbr_clt_io_req *req)
{
	struct sbr_path *path = req->con->path;

	if (req->sg_cnt)
		ib_dma_unmap_sg(path->ibdev, req->sglist, req->sg_size,
				DMA_FROM_DEVICE);
	req->sg_cnt = 0;
	spin_lock(&path->lock);
	req->in_use = false;
	spin_unlock(&path->lock);
}

static void sbr_clt_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("FAST_REG failed: %s\n", ib_wc_status_msg(wc->status));
}

static void sbr_complete_rdma_req(struct sbr_clt_io_req *req, int errno,
				  bool notify, bool can_wait);

static void sbr_clt_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbr_clt_io_req *req =
		container_of(wc->wr_cqe, struct sbr_clt_io_req, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		sbr_err_recovery(req->con->path);
	}
	req->need_inv = false;
	if (req->need_inv_comp)
		complete(&req->inv_comp);
	else
		sbr_complete_rdma_req(req, req->inv_errno, true, false);	/* BUG: rdma-invalidation-leak -- also reached after the LOCAL_INV failed or was flushed: the permit and its pages are recycled with the rkey valid */
}

static void sbr_clt_inv_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbr_clt_io_req *req =
		container_of(wc->wr_cqe, struct sbr_clt_io_req, inv_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		sbr_err_recovery(req->con->path);
}

static void sbr_complete_rdma_req(struct sbr_clt_io_req *req, int errno,
				  bool notify, bool can_wait)
{
	struct sbr_con *con = req->con;
	int err;

	if (WARN_ON(!req->in_use))
		return;

	if (req->sg_cnt && req->need_inv) {
		/*
		 * The server did not invalidate the rkey (or this is
		 * failover): invalidate it here.
		 */
		req->need_inv_comp = can_wait;
		req->inv_errno = errno;
		req->inv_cqe.done = sbr_clt_inv_rkey_done;
		if (can_wait)
			init_completion(&req->inv_comp);
		err = sbr_post_local_inv(con, &req->inv_cqe, req->mr->rkey, true);
		if (err) {
			pr_err("LOCAL_INV of rkey %#x not posted (%d)\n",
			       req->mr->rkey, err);
			sbr_err_recovery(con->path);
		} else if (can_wait) {
			wait_for_completion(&req->inv_comp);
		} else {
			/* finished from sbr_clt_inv_rkey_done() */
			return;
		}
	}

	/* OK: rdma-unmap-before-invalidate -- on the LOCAL_INV path the completion was waited for (or the release happens from it) */
	sbr_free_req(req);	/* BUG: rdma-invalidation-leak -- reached after the LOCAL_INV post failed: the pages are unmapped and the permit handed out again while the server can still write */
	if (notify)
		req->conf(req->priv, errno);
}

static int sbr_clt_read_req(struct sbr_clt_io_req *req)
{
	struct sbr_con *con = req->con;
	struct sbr_path *path = con->path;
	struct sbr_msg_rdma_read *msg = req->iu->buf;
	u32 buf_id = req - path->reqs;
	int nr, err;

	req->sg_cnt = ib_dma_map_sg(path->ibdev, req->sglist, req->sg_size,
				    DMA_FROM_DEVICE);
	if (!req->sg_cnt)
		return -EINVAL;

	nr = ib_map_mr_sg(req->mr, req->sglist, req->sg_cnt, NULL, SZ_4K);
	if (nr != req->sg_cnt) {
		err = nr < 0 ? nr : -EINVAL;
		goto out_free;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	memset(&req->rwr, 0, sizeof(req->rwr));
	req->rwr.wr.opcode = IB_WR_REG_MR;
	req->rwr.wr.wr_cqe = &sbr_fast_reg_cqe;
	req->rwr.mr = req->mr;
	req->rwr.key = req->mr->rkey;
	req->rwr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	msg->sg_cnt = 1;
	msg->desc.addr = cpu_to_le64(req->mr->iova);
	msg->desc.key = cpu_to_le32(req->mr->rkey);
	msg->desc.len = cpu_to_le32(req->mr->length);

	req->sge.addr = req->iu->dma_addr;
	req->sge.length = sizeof(*msg) + req->usr_len;
	req->sge.lkey = path->pd->local_dma_lkey;

	memset(&req->imm_wr, 0, sizeof(req->imm_wr));
	req->imm_wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	req->imm_wr.wr.wr_cqe = &req->iu->cqe;
	req->imm_wr.wr.sg_list = &req->sge;
	req->imm_wr.wr.num_sge = 1;
	req->imm_wr.wr.send_flags = IB_SEND_SIGNALED;
	req->imm_wr.wr.ex.imm_data = cpu_to_be32(sbr_to_imm(SBR_IO_REQ_IMM, buf_id));
	req->imm_wr.remote_addr = path->srv_addr[buf_id];
	req->imm_wr.rkey = path->srv_rkey;
	req->rwr.wr.next = &req->imm_wr.wr;

	req->need_inv = true;
	req->start_jiffies = jiffies;
	err = ib_post_send(con->qp, &req->rwr.wr, NULL);
	if (unlikely(err)) {
		pr_err("READ request post failed (%d)\n", err);
		req->need_inv = false;
		goto out_free;
	}
	return 0;

out_free:
	sbr_free_req(req);	/* OK: rdma-invalidation-leak -- nothing was posted, the rkey never left */
	return err;
}

int sbr_clt_read(struct sbr_path *path, struct scatterlist *sg,
		 unsigned int sg_size, void *usr_msg, unsigned int usr_len,
		 void (*conf)(void *priv, int errno), void *priv)
{
	struct sbr_clt_io_req *req;
	struct sbr_msg_rdma_read *msg;

	req = sbr_get_permit(path);
	if (!req)
		return -EBUSY;

	req->con = path->con[1 + path->next_con++ % (path->con_num - 1)];
	req->sglist = sg;
	req->sg_size = sg_size;
	req->usr_len = usr_len;
	req->conf = conf;
	req->priv = priv;
	msg = req->iu->buf;
	memcpy(msg + 1, usr_msg, usr_len);
	msg->usr_len = usr_len;

	return sbr_clt_read_req(req);
}

static void sbr_clt_inv_by_peer(struct sbr_con *con, struct ib_wc *wc)
{
	struct sbr_path *path = con->path;
	u32 rkey = wc->ex.invalidate_rkey;
	unsigned int i;

	for (i = 0; i < path->queue_depth; i++) {
		struct sbr_clt_io_req *req = &path->reqs[i];

		if (req->in_use && req->need_inv && req->mr->rkey == rkey) {
			req->need_inv = false;
			return;
		}
	}
	pr_err("server invalidated unknown rkey %#x\n", rkey);
	sbr_err_recovery(path);
}

static void sbr_process_io_rsp(struct sbr_con *con, u32 msg_id, int errno,
			       bool w_inv)
{
	struct sbr_path *path = con->path;
	struct sbr_clt_io_req *req;

	if (WARN_ON(msg_id >= path->queue_depth))
		return;
	req = &path->reqs[msg_id];
	if (WARN_ON(!req->in_use))
		return;

	/*
	 * W_INV in the immediate is only what the server says it did; the
	 * permit counts as invalidated once sbr_clt_inv_by_peer() matched
	 * the rkey of its SEND_WITH_INV.
	 */
	if (w_inv && req->need_inv)
		pr_warn("msg %u: W_INV response but rkey %#x not invalidated\n",
			msg_id, req->mr->rkey);
	sbr_complete_rdma_req(req, errno, true, false);	/* OK: rdma-invalidation-leak -- posts the LOCAL_INV itself unless the peer's SEND_WITH_INV matched this rkey */
}

void sbr_clt_rdma_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbr_iu *iu = container_of(wc->wr_cqe, struct sbr_iu, cqe);
	struct sbr_con *con = iu->con;
	u32 imm_type, imm_payload;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			sbr_err_recovery(con->path);
		return;
	}

	switch (wc->opcode) {
	case IB_WC_RECV_RDMA_WITH_IMM:
		sbr_from_imm(be32_to_cpu(wc->ex.imm_data), &imm_type, &imm_payload);
		if (imm_type == SBR_IO_RSP_IMM || imm_type == SBR_IO_RSP_W_INV_IMM)
			sbr_process_io_rsp(con, imm_payload & 0xffff,
					   -(int)(imm_payload >> 16),
					   imm_type == SBR_IO_RSP_W_INV_IMM);
		sbr_iu_post_recv(con, iu);
		break;
	case IB_WC_RECV:
		/* server invalidations come as SEND_WITH_INV */
		if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
			sbr_clt_inv_by_peer(con, wc);	/* OK: rdma-remote-invalidate-unchecked -- the helper matches wc->ex.invalidate_rkey against the permits' rkeys */
		sbr_iu_post_recv(con, iu);
		break;
	case IB_WC_RDMA_WRITE:
		break;
	default:
		pr_warn("unexpected completion opcode %d\n", wc->opcode);
		break;
	}
}

/*
 * READs without a response within SBR_IO_TIMEOUT_MS are failed back to
 * the user; the server may only be slow, so their rkeys are killed first.
 */
static void sbr_reaper_work(struct work_struct *work)
{
	struct sbr_path *path =
		container_of(to_delayed_work(work), struct sbr_path, reaper_dwork);
	unsigned long timeout = msecs_to_jiffies(SBR_IO_TIMEOUT_MS);
	unsigned int i;

	for (i = 0; i < path->queue_depth; i++) {
		struct sbr_clt_io_req *req = &path->reqs[i];

		if (!req->in_use || jiffies - req->start_jiffies < timeout)
			continue;

		if (req->need_inv) {
			req->inv_cqe.done = sbr_clt_inv_err_done;
			if (sbr_post_local_inv(req->con, &req->inv_cqe,
					       req->mr->rkey, false)) {
				sbr_err_recovery(path);
				continue;
			}
			req->need_inv = false;
		}
		sbr_free_req(req);	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV was only queued; pages unmapped and permit reused before it executed */
		req->conf(req->priv, -ETIMEDOUT);
	}
	queue_delayed_work(system_wq, &path->reaper_dwork, timeout);
}

int sbr_alloc_reqs(struct sbr_path *path)
{
	unsigned int i;

	path->reqs = kcalloc(path->queue_depth, sizeof(*path->reqs), GFP_KERNEL);
	if (!path->reqs)
		return -ENOMEM;

	for (i = 0; i < path->queue_depth; i++) {
		struct sbr_clt_io_req *req = &path->reqs[i];

		req->mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG,
				      path->max_pages_per_mr);
		if (IS_ERR(req->mr)) {
			req->mr = NULL;
			sbr_free_reqs(path);
			return -ENOMEM;
		}
		init_completion(&req->inv_comp);
	}
	INIT_DELAYED_WORK(&path->reaper_dwork, sbr_reaper_work);
	return 0;
}

void sbr_free_reqs(struct sbr_path *path)
{
	unsigned int i;

	for (i = 0; i < path->queue_depth; i++)
		if (path->reqs[i].mr)
			ib_dereg_mr(path->reqs[i].mr);	/* OK: rdma-invalidation-leak -- deregistration kills the rkey */
	kfree(path->reqs);
	path->reqs = NULL;
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb RTRS style client I/O path");
