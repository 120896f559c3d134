// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * kc_rtrs_clt.c - RTRS style block transport, one path (rtrs-clt style): a
 * table of REMOTE_WRITE chunk MRs whose rkeys go out in the session info and
 * are registered again on reconnect; READ I/O fast-registers the request's MR
 * and expects SEND_WITH_INV, else posts the LOCAL_INV itself.
 * Known problems: reconnect key rotation writes the old key back; remote
 * invalidation accepted unchecked; an unposted LOCAL_INV still recycles the
 * request; error recovery unmaps right behind its LOCAL_INVs; a failed open
 * unmaps exposed chunks before deregistering them; a short chunk mapping
 * leaks its MR; no SQ slot for the drain.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/atomic.h>
#include <rdma/rdma_cm.h>

#define KC_RTRS_MAX_CHUNKS		64
#define KC_RTRS_INLINE			128
#define KC_RTRS_CONNECT_TIMEOUT_MS	5000

struct kc_rtrs_iu {
	struct ib_cqe		cqe;
	struct kc_rtrs_path	*path;
	void			*buf;
	u64			dma;
};

struct kc_rtrs_msg_io {		/* READ request; the response is id, status */
	__le32	id, rkey;
	__le64	addr;
	__le32	len;
};

struct kc_rtrs_msg_info {
	u32	chunks;
	struct {
		__le64	addr;
		__le32	rkey, len;
	} desc[KC_RTRS_MAX_CHUNKS];
};

struct kc_rtrs_req {
	struct kc_rtrs_path	*path;
	struct list_head	list;	/* path->free_reqs or path->inflight */
	u32			id;
	struct ib_mr		*mr;
	struct scatterlist	*sglist;
	u32			sg_cnt;
	enum dma_data_direction	dir;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe, inv_cqe;
	struct kc_rtrs_iu	*iu;
	struct completion	inv_comp;
	bool			need_inv, need_inv_comp;
	int			inv_errno;
	void			(*conf)(void *priv, int errno);
	void			*priv;
};

struct kc_rtrs_path {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			queue_depth, max_inline, signal_interval;
	atomic_t		wr_cnt;
	struct kc_rtrs_req	*reqs;
	spinlock_t		lock;
	struct list_head	free_reqs, inflight;
	struct ib_mr		*mrs[KC_RTRS_MAX_CHUNKS];
	struct sg_table		chunk_sgt[KC_RTRS_MAX_CHUNKS];
	u32			mrs_num;
	struct kc_rtrs_iu	*info_iu;
	struct ib_cqe		reg_cqe;
	struct completion	reg_done, info_done;
	int			reg_status;
	struct work_struct	err_work;
};

static void kc_rtrs_complete_req(struct kc_rtrs_req *req, int errno,
				 bool can_wait);

int kc_rtrs_create_qp(struct kc_rtrs_path *path)
{
	struct ib_qp_init_attr init_attr = {};
	int ret;

	init_attr.send_cq = path->cq;
	init_attr.recv_cq = path->cq;
	/* REG_MR + SEND + LOCAL_INV per read */
	/* BUG(file): rdma-send-queue-undersized, rdma-send-queue-manual-factor -- hand-made factor of 3 with no slot left for the drain WR that kc_rtrs_close_path() posts through ib_drain_qp() */
	init_attr.cap.max_send_wr = 3 * path->queue_depth;
	init_attr.cap.max_recv_wr = path->queue_depth + 1; /* OK: rdma-send-queue-undersized -- one receive per request plus one for the drain */
	init_attr.cap.max_send_sge = min_t(u32, 2, path->ibdev->attrs.max_send_sge);
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_inline_data = KC_RTRS_INLINE; /* OK: rdma-queue-cap-unchecked -- the granted value is read back from init_attr.cap below */
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(path->cm_id, path->pd, &init_attr);
	if (ret)
		return ret;
	path->qp = path->cm_id->qp;
	path->max_inline = init_attr.cap.max_inline_data;
	return 0;
}

static void kc_rtrs_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_rtrs_path *path =
		container_of(wc->wr_cqe, struct kc_rtrs_path, reg_cqe);

	path->reg_status = wc->status;
	complete(&path->reg_done);
}

/*
 * One REMOTE_WRITE MR per receive chunk.  On reconnect (called by the session
 * reconnect worker with a new QP) the MRs survive: invalidate them and
 * register them again.
 */
int kc_rtrs_reg_chunks(struct kc_rtrs_path *path, bool reconnect)
{
	struct ib_send_wr inv, *first;
	struct ib_reg_wr rwr;
	struct sg_table *sgt;
	struct ib_mr *mr;
	int i, nr, err;
	u8 key;

	path->reg_cqe.done = kc_rtrs_reg_done;
	reinit_completion(&path->reg_done);
	for (i = 0; i < path->mrs_num; i++) {
		sgt = &path->chunk_sgt[i];
		memset(&rwr, 0, sizeof(rwr));
		first = &rwr.wr;
		if (reconnect) {
			mr = path->mrs[i];
			memset(&inv, 0, sizeof(inv));
			inv.opcode = IB_WR_LOCAL_INV;
			inv.ex.invalidate_rkey = mr->rkey;
			inv.next = &rwr.wr;
			first = &inv;
			/* the old session knows the previous key */
			key = (u8)(mr->rkey & 0x000000ff);
			ib_update_fast_reg_key(mr, key++);
		} else {
			sgt->nents = ib_dma_map_sg(path->ibdev, sgt->sgl,
						   sgt->orig_nents, DMA_BIDIRECTIONAL);
			if (!sgt->nents) {
				err = -EIO;
				goto err_dereg;
			}
			/* OK: rdma-registration-in-datapath -- the chunk table is registered once per session */
			mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG, sgt->nents);
			if (IS_ERR(mr)) {
				err = PTR_ERR(mr);
				goto err_unmap;
			}
			nr = ib_map_mr_sg(mr, sgt->sgl, sgt->nents, NULL, PAGE_SIZE);
			if (nr != sgt->nents) {
				err = nr < 0 ? nr : -EINVAL;
				goto err_unmap; /* BUG: rdma-mr-leak -- mr is not in path->mrs[] yet, the unwinding below never sees it */
			}
			path->mrs[i] = mr;
		}

		rwr.wr.opcode = IB_WR_REG_MR;
		rwr.mr = mr; /* BUG: rdma-rkey-reuse -- on reconnect key++ hands back the old low byte: the chunk is registered again under the key the previous session held */
		rwr.key = mr->rkey;
		rwr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is there and the rkeys go to the server in the session info */
		if (i == path->mrs_num - 1) {
			rwr.wr.wr_cqe = &path->reg_cqe;
			rwr.wr.send_flags = IB_SEND_SIGNALED;
		}
		err = ib_post_send(path->qp, first, NULL);
		if (err) {
			i++;
			goto err_dereg;
		}
	}
	wait_for_completion(&path->reg_done);
	if (!path->reg_status)
		return 0;
	err = -EIO;
	goto err_dereg;

err_unmap:
	ib_dma_unmap_sg(path->ibdev, sgt->sgl, sgt->orig_nents, DMA_BIDIRECTIONAL);
err_dereg:
	if (reconnect)
		return err;	/* the session teardown releases the chunks */
	while (i--) {
		ib_dereg_mr(path->mrs[i]);
		ib_dma_unmap_sg(path->ibdev, path->chunk_sgt[i].sgl, /* OK: rdma-invalidation-leak -- the registered chunk is deregistered before its pages go back */
				path->chunk_sgt[i].orig_nents, DMA_BIDIRECTIONAL);
	}
	return err;
}

static void kc_rtrs_wr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("WR failed: %s\n", ib_wc_status_msg(wc->status));
}

static int kc_rtrs_send_info(struct kc_rtrs_path *path)
{
	struct kc_rtrs_msg_info *msg = path->info_iu->buf;
	struct ib_sge sge = {
		.addr = path->info_iu->dma,
		.length = sizeof(*msg),
		.lkey = path->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_cqe = &path->info_iu->cqe,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IB_WR_SEND,
		.send_flags = IB_SEND_SIGNALED,
	};
	int i;

	msg->chunks = path->mrs_num;
	for (i = 0; i < path->mrs_num; i++) {
		msg->desc[i].addr = cpu_to_le64(path->mrs[i]->iova);
		msg->desc[i].rkey = cpu_to_le32(path->mrs[i]->rkey);
		msg->desc[i].len = cpu_to_le32(path->mrs[i]->length);
	}
	path->info_iu->cqe.done = kc_rtrs_wr_done;
	return ib_post_send(path->qp, &wr, NULL);
}

static void kc_rtrs_put_req(struct kc_rtrs_path *path, struct kc_rtrs_req *req)
{
	unsigned long flags;

	spin_lock_irqsave(&path->lock, flags);
	list_del(&req->list);
	list_add(&req->list, &path->free_reqs);
	spin_unlock_irqrestore(&path->lock, flags);
}

static void kc_rtrs_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_rtrs_req *req =
		container_of(wc->wr_cqe, struct kc_rtrs_req, inv_cqe);

	if (wc->status != IB_WC_SUCCESS)
		schedule_work(&req->path->err_work);
	req->need_inv = false;
	if (req->need_inv_comp)
		complete(&req->inv_comp);
	else
		kc_rtrs_complete_req(req, req->inv_errno, false);
}

static int kc_rtrs_inv_rkey(struct kc_rtrs_req *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = &req->inv_cqe,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = kc_rtrs_inv_rkey_done;
	return ib_post_send(req->path->qp, &wr, NULL);
}

static void kc_rtrs_complete_req(struct kc_rtrs_req *req, int errno,
				 bool can_wait)
{
	struct kc_rtrs_path *path = req->path;
	int err;

	if (req->sg_cnt) {
		if (req->need_inv) {
			/* no INV from the server, or failover: do it ourselves */
			if (can_wait)
				req->need_inv_comp = true;
			else
				req->inv_errno = errno;
			err = kc_rtrs_inv_rkey(req);
			if (err)
				pr_err("Send INV WR key=%#x: %d\n", req->mr->rkey, err);
			else if (can_wait)
				wait_for_completion(&req->inv_comp); /* OK: rdma-unmap-before-invalidate -- the unmap below waits for the LOCAL_INV completion */
			else
				return;	/* completed from kc_rtrs_inv_rkey_done() */
		}
		/* BUG: rdma-invalidation-leak -- when the LOCAL_INV could not be posted the pages are unmapped and the request recycled with its rkey live */
		ib_dma_unmap_sg(path->ibdev, req->sglist, req->sg_cnt, req->dir);
	}
	kc_rtrs_put_req(path, req);
	req->conf(req->priv, errno);
}

int kc_rtrs_read_req(struct kc_rtrs_path *path, struct kc_rtrs_req *req)
{
	struct kc_rtrs_msg_io *msg = req->iu->buf;
	struct ib_sge sge = {
		.addr = req->iu->dma,
		.length = sizeof(*msg),
		.lkey = path->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_cqe = &req->iu->cqe,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IB_WR_SEND,
	};
	int count, nr, err;

	req->dir = DMA_FROM_DEVICE;
	count = ib_dma_map_sg(path->ibdev, req->sglist, req->sg_cnt, req->dir);
	if (!count)
		return -EIO;
	nr = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
	if (nr != count) {
		err = nr < 0 ? nr : -EINVAL;
		goto out_unmap;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_cqe.done = kc_rtrs_wr_done;
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.next = &wr;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- rotated with ib_inc_rkey() for every read */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	msg->id = cpu_to_le32(req->id);
	msg->rkey = cpu_to_le32(req->mr->rkey);
	msg->addr = cpu_to_le64(req->mr->iova);
	msg->len = cpu_to_le32(req->mr->length);

	req->iu->cqe.done = kc_rtrs_wr_done;
	if (atomic_inc_return(&path->wr_cnt) % path->signal_interval == 0)
		wr.send_flags = IB_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- wr_cnt advances on every post */

	req->need_inv = true;
	err = ib_post_send(path->qp, &req->reg_wr.wr, NULL);
	if (!err)
		return 0;
out_unmap:
	ib_dma_unmap_sg(path->ibdev, req->sglist, req->sg_cnt, req->dir); /* OK: rdma-invalidation-leak -- REG_MR and SEND were refused together, no key went out */
	return err;
}

void kc_rtrs_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_rtrs_iu *iu = container_of(wc->wr_cqe, struct kc_rtrs_iu, cqe);
	__le32 *rsp = iu->buf;
	struct kc_rtrs_path *path = iu->path;
	struct kc_rtrs_req *req;
	u32 id;

	id = le32_to_cpu(rsp[0]);
	if (unlikely(wc->status != IB_WC_SUCCESS || id >= path->queue_depth)) {
		schedule_work(&path->err_work);
		return;
	}
	req = &path->reqs[id];

	/* key invalidation from the server side */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) /* BUG: rdma-remote-invalidate-unchecked -- wc->ex.invalidate_rkey is not compared with req->mr->rkey before the LOCAL_INV is dropped */
		req->need_inv = false;
	kc_rtrs_complete_req(req, (int)le32_to_cpu(rsp[1]), false);
}

/* Error recovery: kill every outstanding read MR, then fail the I/O. */
static void kc_rtrs_fail_inflight(struct kc_rtrs_path *path)
{
	struct kc_rtrs_req *req, *tmp;

	/* I/O is quiesced; post all invalidations first, they run in parallel */
	list_for_each_entry(req, &path->inflight, list) {
		if (req->need_inv) {
			req->need_inv_comp = true;
			kc_rtrs_inv_rkey(req);
		}
	}
	list_for_each_entry_safe(req, tmp, &path->inflight, list) {
		/* BUG: rdma-unmap-before-invalidate -- nothing waits for the LOCAL_INV completions (req->inv_comp) before the pages go back */
		ib_dma_unmap_sg(path->ibdev, req->sglist, req->sg_cnt, req->dir);
		kc_rtrs_put_req(path, req);
		req->conf(req->priv, -ECONNRESET);
	}
}

int kc_rtrs_path_open(struct kc_rtrs_path *path)
{
	int err, i;

	err = kc_rtrs_create_qp(path);
	if (err)
		return err;
	err = kc_rtrs_reg_chunks(path, false);
	if (err)
		goto err_destroy_qp;
	err = kc_rtrs_send_info(path);
	if (err)
		goto err_unmap_chunks;
	if (!wait_for_completion_timeout(&path->info_done,
			msecs_to_jiffies(KC_RTRS_CONNECT_TIMEOUT_MS))) {
		err = -ETIMEDOUT;
		goto err_unmap_chunks;
	}
	return 0;

err_unmap_chunks:
	for (i = 0; i < path->mrs_num; i++) {
		/* BUG: rdma-invalidation-leak -- the chunk pages go back while their REMOTE_WRITE keys, already sent in the session info, are still registered */
		ib_dma_unmap_sg(path->ibdev, path->chunk_sgt[i].sgl,
				path->chunk_sgt[i].orig_nents, DMA_BIDIRECTIONAL);
		ib_dereg_mr(path->mrs[i]);
	}
err_destroy_qp:
	rdma_destroy_qp(path->cm_id);
	return err;
}

void kc_rtrs_close_path(struct kc_rtrs_path *path)
{
	int i;

	kc_rtrs_fail_inflight(path);
	ib_drain_qp(path->qp);
	for (i = 0; i < path->mrs_num; i++) {
		ib_dereg_mr(path->mrs[i]);
		ib_dma_unmap_sg(path->ibdev, path->chunk_sgt[i].sgl, /* OK: rdma-invalidation-leak -- the chunk MR was deregistered just before */
				path->chunk_sgt[i].orig_nents, DMA_BIDIRECTIONAL);
	}
	rdma_destroy_qp(path->cm_id);
}

MODULE_LICENSE("GPL");
