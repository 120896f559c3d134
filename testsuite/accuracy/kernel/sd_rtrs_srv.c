// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * sd_rtrs_srv.c - RTRS-style block transport, server side of a path.
 *
 * A path has one service connection (cid 0: info exchange, heartbeats) and
 * con_num - 1 I/O connections.  The server owns queue_depth chunks of
 * chunk_size bytes, each with its own MR; at path setup every chunk is
 * fast-registered (LOCAL_WRITE | REMOTE_WRITE) over the service connection
 * and its rkey goes to the client in the info response.  The client writes
 * a request (and write data) into a chunk with RDMA_WRITE_WITH_IMM; the
 * server answers with RDMA_WRITE_WITH_IMM, after first writing the data
 * into the client's buffer for a read.
 *
 * With always_invalidate the server re-arms a chunk after every I/O: the
 * response is preceded by LOCAL_INV of the chunk's key and a REG_MR under a
 * new key, and becomes a SEND_WITH_IMM carrying that key.
 *
 * Signaling: requested WRs only.  Responses are signaled every
 * signal_interval posts; heartbeats are meant to be signaled every
 * SDSRV_HB_SIG_EVERY.
 *
 * Known problems: an I/O connection reserves three send WRs per I/O but a
 * read with always_invalidate posts four; the heartbeat signaling counter
 * never advances; a failed rkey-message allocation during chunk setup
 * leaks that chunk's MR.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad -- not the subject of this file
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- not the subject of this file
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath -- not the subject of this file
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SDSRV_SERVICE_DEPTH	512
#define SDSRV_WR_PER_IO		3	/* LOCAL_INV + REG_MR + response */
#define SDSRV_HB_SIG_EVERY	8
#define SDSRV_HB_INTERVAL_MS	5000
#define SDSRV_SERVICE_RECVS	16

enum { SDSRV_DIR_READ, SDSRV_DIR_WRITE };
enum { SDSRV_MSG_INFO_RSP = 1, SDSRV_MSG_RKEY_RSP, SDSRV_MSG_HB };

struct sdsrv_msg_req {			/* at the start of the chunk */
	__le32	dir;
	__le32	data_len;
	__le64	addr;			/* client buffer for read data */
	__le32	key;
	__le32	rsvd;
};

struct sdsrv_rkey_rsp {
	__le32	type;
	__le32	msg_id;
	__le32	rkey;
	__le32	status;
};

struct sdsrv_hb_msg {
	__le32	type;
	__le32	seq;
};

struct sdsrv_iu {
	void			*buf;
	u64			dma_addr;
	size_t			size;
	enum dma_data_direction	dir;
	struct ib_cqe		cqe;
};

struct sdsrv_mr {
	struct ib_mr		*mr;
	struct sg_table		sgt;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct sdsrv_iu		*iu;		/* rkey message of the response */
};

struct sdsrv_op {
	struct sdsrv_con	*con;
	u32			msg_id;
	int			dir;
	u32			data_len;
	u64			remote_addr;
	u32			remote_key;
	struct ib_sge		data_sge;
	struct ib_rdma_wr	data_wr;
	struct ib_sge		rsp_sge;
	struct ib_rdma_wr	rsp_wr;
};

struct sdsrv_con {
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			cid;
	u32			nr_cqe;
	atomic_t		wr_cnt;
	atomic_t		hb_unsig;	/* heartbeats since the last signaled one */
	struct sdsrv_path	*path;
	struct sdsrv_iu		*hb_iu;
	struct ib_send_wr	hb_wr;
	struct ib_sge		hb_sge;
	struct ib_cqe		recv_cqe;
	struct ib_cqe		rsp_cqe;
	struct ib_cqe		reg_cqe;	/* setup registrations */
	struct ib_cqe		rearm_cqe;	/* unsignaled LOCAL_INV/REG_MR, errors only */
};

struct sdsrv_path {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct sdsrv_con	**con;
	u32			con_num;
	struct sdsrv_mr		*mrs;
	u32			mrs_num;
	struct sdsrv_op		*ops;
	struct page		**chunks;
	u32			queue_depth;
	u32			chunk_size;
	u32			signal_interval;
	bool			always_invalidate;
	atomic_t		regs_pending;
	wait_queue_head_t	regs_wait;
	u32			hb_seq;
	struct delayed_work	hb_dwork;
};

/* block backend, elsewhere; completes with sdsrv_send_io_resp() */
void sdsrv_backend_submit(struct sdsrv_op *op, void *data);

static void sdsrv_recv_done(struct ib_cq *cq, struct ib_wc *wc);
static void sdsrv_rsp_done(struct ib_cq *cq, struct ib_wc *wc);
static void sdsrv_reg_done(struct ib_cq *cq, struct ib_wc *wc);
static void sdsrv_rearm_done(struct ib_cq *cq, struct ib_wc *wc);
static void sdsrv_iu_done(struct ib_cq *cq, struct ib_wc *wc);

static struct sdsrv_iu *sdsrv_iu_alloc(size_t size, struct ib_device *dev,
				       enum dma_data_direction dir)
{
	struct sdsrv_iu *iu = kzalloc(sizeof(*iu), GFP_KERNEL);

	if (!iu)
		return NULL;
	iu->buf = kzalloc(size, GFP_KERNEL);
	if (!iu->buf)
		goto free_iu;
	iu->dma_addr = ib_dma_map_single(dev, iu->buf, size, dir);
	if (ib_dma_mapping_error(dev, iu->dma_addr))
		goto free_buf;
	iu->size = size;
	iu->dir = dir;
	iu->cqe.done = sdsrv_iu_done;
	return iu;

free_buf:
	kfree(iu->buf);
free_iu:
	kfree(iu);
	return NULL;
}

static void sdsrv_iu_free(struct sdsrv_iu *iu, struct ib_device *dev)
{
	if (!iu)
		return;
	ib_dma_unmap_single(dev, iu->dma_addr, iu->size, iu->dir);
	kfree(iu->buf);
	kfree(iu);
}

/*
 * Fill the chunk's REG_MR, at setup and when re-arming after an I/O; every
 * registration gets a key the client has not seen yet.
 */
static void sdsrv_prep_reg_wr(struct sdsrv_mr *srv_mr)
{
	ib_update_fast_reg_key(srv_mr->mr, ib_inc_rkey(srv_mr->mr->rkey));
	srv_mr->reg_wr.wr.opcode = IB_WR_REG_MR;
	srv_mr->reg_wr.wr.num_sge = 0;
	srv_mr->reg_wr.mr = srv_mr->mr;		/* OK: rdma-rkey-reuse -- the key is bumped with ib_inc_rkey() before the work request takes it */
	srv_mr->reg_wr.key = srv_mr->mr->rkey;
	srv_mr->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
}

static int sdsrv_map_chunks(struct sdsrv_path *path)
{
	struct sdsrv_con *scon = path->con[0];
	struct sdsrv_mr *srv_mr;
	struct ib_mr *mr;
	u32 mri;
	int nr, err;

	path->mrs = kcalloc(path->queue_depth, sizeof(*path->mrs), GFP_KERNEL);
	if (!path->mrs)
		return -ENOMEM;
	path->mrs_num = path->queue_depth;
	atomic_set(&path->regs_pending, 0);

	for (mri = 0; mri < path->mrs_num; mri++) {
		srv_mr = &path->mrs[mri];
		err = sg_alloc_table(&srv_mr->sgt, 1, GFP_KERNEL);
		if (err)
			goto err_unwind;
		sg_set_page(srv_mr->sgt.sgl, path->chunks[mri], path->chunk_size, 0);
		nr = ib_dma_map_sg(path->ibdev, srv_mr->sgt.sgl, 1, DMA_BIDIRECTIONAL);
		if (nr != 1) {
			err = -EINVAL;
			goto free_sg;
		}
		mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG, 1);
		if (IS_ERR(mr)) {
			err = PTR_ERR(mr);
			goto unmap_sg;
		}
		nr = ib_map_mr_sg(mr, srv_mr->sgt.sgl, 1, NULL, path->chunk_size);
		if (nr != 1) {
			ib_dereg_mr(mr);	/* OK: rdma-mr-leak -- released before leaving the iteration */
			err = nr < 0 ? nr : -EINVAL;
			goto unmap_sg;
		}
		srv_mr->mr = mr;
		srv_mr->iu = sdsrv_iu_alloc(sizeof(struct sdsrv_rkey_rsp), path->ibdev, DMA_TO_DEVICE);
		if (!srv_mr->iu) {
			err = -ENOMEM;
			goto unmap_sg;	/* BUG: rdma-mr-leak -- this chunk's MR is never deregistered: the unwinding loop only walks the chunks before mri */
		}
		sdsrv_prep_reg_wr(srv_mr);
		srv_mr->reg_wr.wr.wr_cqe = &scon->reg_cqe;
		srv_mr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
		atomic_inc(&path->regs_pending);
		err = ib_post_send(scon->qp, &srv_mr->reg_wr.wr, NULL);
		if (err) {
			atomic_dec(&path->regs_pending);
			sdsrv_iu_free(srv_mr->iu, path->ibdev);
			ib_dereg_mr(srv_mr->mr);	/* OK: rdma-mr-leak -- this chunk's MR is released before the jump */
			goto unmap_sg;
		}
	}
	wait_event(path->regs_wait, atomic_read(&path->regs_pending) == 0);
	return 0;

unmap_sg:
	ib_dma_unmap_sg(path->ibdev, path->mrs[mri].sgt.sgl, 1, DMA_BIDIRECTIONAL);
free_sg:
	sg_free_table(&path->mrs[mri].sgt);
err_unwind:
	/* registrations already posted must finish before their MRs go */
	wait_event(path->regs_wait, atomic_read(&path->regs_pending) == 0);
	while (mri--) {
		srv_mr = &path->mrs[mri];
		sdsrv_iu_free(srv_mr->iu, path->ibdev);
		ib_dereg_mr(srv_mr->mr);
		ib_dma_unmap_sg(path->ibdev, srv_mr->sgt.sgl, 1, DMA_BIDIRECTIONAL);
		sg_free_table(&srv_mr->sgt);
	}
	kfree(path->mrs);
	path->mrs = NULL;
	return err;
}

static void sdsrv_unmap_chunks(struct sdsrv_path *path)
{
	u32 i;

	for (i = 0; i < path->mrs_num; i++) {
		struct sdsrv_mr *srv_mr = &path->mrs[i];

		sdsrv_iu_free(srv_mr->iu, path->ibdev);
		ib_dereg_mr(srv_mr->mr);
		ib_dma_unmap_sg(path->ibdev, srv_mr->sgt.sgl, 1, DMA_BIDIRECTIONAL);
		sg_free_table(&srv_mr->sgt);
	}
	kfree(path->mrs);
	path->mrs = NULL;
}

static void sdsrv_qp_event(struct ib_event *ev, void *ctx)
{
	pr_info("sdsrv: QP event on con %u\n", ((struct sdsrv_con *)ctx)->cid);
}

static int sdsrv_cq_qp_create(struct sdsrv_con *con, u32 max_send_wr, u32 max_recv_wr)
{
	struct sdsrv_path *path = con->path;
	struct ib_qp_init_attr init_attr = {};
	int err;

	con->nr_cqe = max_send_wr + max_recv_wr;
	con->cq = ib_cq_pool_get(path->ibdev, con->nr_cqe, con->cid, IB_POLL_SOFTIRQ);
	if (IS_ERR(con->cq))
		return PTR_ERR(con->cq);

	init_attr.cap.max_send_wr = max_send_wr;
	init_attr.cap.max_recv_wr = max_recv_wr;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.event_handler = sdsrv_qp_event;
	init_attr.qp_context = con;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = con->cq;
	init_attr.recv_cq = con->cq;
	err = rdma_create_qp(con->cm_id, path->pd, &init_attr);
	if (err) {
		ib_cq_pool_put(con->cq, con->nr_cqe);
		return err;
	}
	con->qp = con->cm_id->qp;
	return 0;
}

static int sdsrv_post_recv(struct sdsrv_con *con)
{
	struct ib_recv_wr wr = { .wr_cqe = &con->recv_cqe };	/* immediate data only */

	return ib_post_recv(con->qp, &wr, NULL);
}

static int sdsrv_create_con(struct sdsrv_path *path, struct rdma_cm_id *cm_id, u32 cid)
{
	struct sdsrv_con *con;
	u32 max_send_wr, max_recv_wr, wr_limit, i;
	int err;

	con = kzalloc(sizeof(*con), GFP_KERNEL);
	if (!con)
		return -ENOMEM;
	con->cm_id = cm_id;
	con->cid = cid;
	con->path = path;
	atomic_set(&con->wr_cnt, 1);
	atomic_set(&con->hb_unsig, 0);
	con->recv_cqe.done = sdsrv_recv_done;
	con->rsp_cqe.done = sdsrv_rsp_done;
	con->reg_cqe.done = sdsrv_reg_done;
	con->rearm_cqe.done = sdsrv_rearm_done;

	wr_limit = path->ibdev->attrs.max_qp_wr;
	if (cid == 0) {
		/*
		 * Service connection: the chunk registrations at setup
		 * (queue_depth <= SDSRV_SERVICE_DEPTH), the info response and
		 * heartbeats, one WR each.
		 */
		/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- a fixed service depth; nothing per request is registered through this queue */
		max_send_wr = min_t(u32, wr_limit, SDSRV_SERVICE_DEPTH * 2 + 2);	/* OK: rdma-queue-cap-unchecked -- 1026 is clamped to the device's max_qp_wr */
		max_recv_wr = max_send_wr;
	} else {
		/* BUG(file): rdma-send-queue-manual-factor -- a hand-made per-I/O factor over path->queue_depth for a queue that carries LOCAL_INV and REG_MR */
		max_send_wr = min_t(u32, wr_limit, path->queue_depth * SDSRV_WR_PER_IO + 1);	/* BUG(file): rdma-send-queue-undersized -- a read with always_invalidate posts the data WRITE, LOCAL_INV, REG_MR and the response: four WRs per I/O against three */
		max_recv_wr = min_t(u32, wr_limit, path->queue_depth + 1);
	}
	err = sdsrv_cq_qp_create(con, max_send_wr, max_recv_wr);
	if (err)
		goto free_con;

	if (cid == 0) {
		con->hb_iu = sdsrv_iu_alloc(sizeof(struct sdsrv_hb_msg), path->ibdev, DMA_TO_DEVICE);
		if (!con->hb_iu) {
			err = -ENOMEM;
			goto destroy_qp;
		}
		con->hb_sge.addr = con->hb_iu->dma_addr;
		con->hb_sge.length = sizeof(struct sdsrv_hb_msg);
		con->hb_sge.lkey = path->pd->local_dma_lkey;
		con->hb_wr.opcode = IB_WR_SEND;
		con->hb_wr.wr_cqe = &con->hb_iu->cqe;
		con->hb_wr.sg_list = &con->hb_sge;
		con->hb_wr.num_sge = 1;
	}
	for (i = 0; i < (cid ? path->queue_depth : SDSRV_SERVICE_RECVS); i++) {
		err = sdsrv_post_recv(con);
		if (err)
			goto free_iu;
	}
	cm_id->context = con;
	path->con[cid] = con;
	return 0;

free_iu:
	sdsrv_iu_free(con->hb_iu, path->ibdev);
destroy_qp:
	rdma_destroy_qp(cm_id);
	ib_cq_pool_put(con->cq, con->nr_cqe);
free_con:
	kfree(con);
	return err;
}

static int sdsrv_send_hb(struct sdsrv_con *con)
{
	struct sdsrv_path *path = con->path;
	struct sdsrv_hb_msg *msg = con->hb_iu->buf;

	msg->type = cpu_to_le32(SDSRV_MSG_HB);
	msg->seq = cpu_to_le32(++path->hb_seq);
	ib_dma_sync_single_for_device(path->ibdev, con->hb_iu->dma_addr, sizeof(*msg), DMA_TO_DEVICE);

	con->hb_wr.send_flags = 0;
	if (atomic_read(&con->hb_unsig) >= SDSRV_HB_SIG_EVERY) {	/* BUG: rdma-unsignaled-send-starvation -- hb_unsig is only ever set to 0, nothing counts the unsignaled heartbeats: this branch never runs */
		con->hb_wr.send_flags = IB_SEND_SIGNALED;
		atomic_set(&con->hb_unsig, 0);
	}
	return ib_post_send(con->qp, &con->hb_wr, NULL);
}

static void sdsrv_hb_work(struct work_struct *work)
{
	struct sdsrv_path *path = container_of(to_delayed_work(work), struct sdsrv_path, hb_dwork);

	if (sdsrv_send_hb(path->con[0]))
		pr_err("sdsrv: heartbeat post failed\n");
	queue_delayed_work(system_wq, &path->hb_dwork, msecs_to_jiffies(SDSRV_HB_INTERVAL_MS));
}

int sdsrv_send_io_resp(struct sdsrv_op *op, int status)
{
	struct sdsrv_con *con = op->con;
	struct sdsrv_path *path = con->path;
	struct sdsrv_mr *srv_mr = &path->mrs[op->msg_id];
	struct ib_send_wr *first = NULL, **prev = &first;
	u32 imm = (op->msg_id << 16) | (status ? 1 : 0);

	if (op->dir == SDSRV_DIR_READ && op->data_len && !status) {
		op->data_sge.addr = sg_dma_address(srv_mr->sgt.sgl);
		op->data_sge.length = op->data_len;
		op->data_sge.lkey = path->pd->local_dma_lkey;
		op->data_wr.wr.opcode = IB_WR_RDMA_WRITE;
		op->data_wr.wr.send_flags = 0;
		op->data_wr.wr.wr_cqe = &con->rsp_cqe;
		op->data_wr.wr.sg_list = &op->data_sge;
		op->data_wr.wr.num_sge = 1;
		op->data_wr.remote_addr = op->remote_addr;
		op->data_wr.rkey = op->remote_key;
		*prev = &op->data_wr.wr;
		prev = &op->data_wr.wr.next;
	}

	if (path->always_invalidate) {
		struct sdsrv_rkey_rsp *msg = srv_mr->iu->buf;

		memset(&srv_mr->inv_wr, 0, sizeof(srv_mr->inv_wr));
		srv_mr->inv_wr.opcode = IB_WR_LOCAL_INV;
		srv_mr->inv_wr.wr_cqe = &con->rearm_cqe;
		srv_mr->inv_wr.send_flags = IB_SEND_FENCE;	/* OK: rdma-unsignaled-send-starvation -- unsignaled, retired with the response posted behind it */
		srv_mr->inv_wr.ex.invalidate_rkey = srv_mr->mr->rkey;
		*prev = &srv_mr->inv_wr;
		prev = &srv_mr->inv_wr.next;

		sdsrv_prep_reg_wr(srv_mr);
		srv_mr->reg_wr.wr.wr_cqe = &con->rearm_cqe;
		srv_mr->reg_wr.wr.send_flags = 0;
		*prev = &srv_mr->reg_wr.wr;
		prev = &srv_mr->reg_wr.wr.next;

		msg->type = cpu_to_le32(SDSRV_MSG_RKEY_RSP);
		msg->msg_id = cpu_to_le32(op->msg_id);
		msg->rkey = cpu_to_le32(srv_mr->reg_wr.key);
		msg->status = cpu_to_le32(status);
		ib_dma_sync_single_for_device(path->ibdev, srv_mr->iu->dma_addr,
					      sizeof(*msg), DMA_TO_DEVICE);
		op->rsp_sge.addr = srv_mr->iu->dma_addr;
		op->rsp_sge.length = sizeof(*msg);
		op->rsp_sge.lkey = path->pd->local_dma_lkey;
		op->rsp_wr.wr.opcode = IB_WR_SEND_WITH_IMM;
		op->rsp_wr.wr.sg_list = &op->rsp_sge;
		op->rsp_wr.wr.num_sge = 1;
	} else {
		op->rsp_wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
		op->rsp_wr.wr.sg_list = NULL;
		op->rsp_wr.wr.num_sge = 0;
		op->rsp_wr.remote_addr = op->remote_addr;
		op->rsp_wr.rkey = op->remote_key;
	}
	op->rsp_wr.wr.ex.imm_data = cpu_to_be32(imm);
	op->rsp_wr.wr.wr_cqe = &con->rsp_cqe;
	/* from time to time a signaled send, or the send queue fills up */
	op->rsp_wr.wr.send_flags = atomic_inc_return(&con->wr_cnt) % path->signal_interval ?
				   0 : IB_SEND_SIGNALED;	/* OK: rdma-unsignaled-send-starvation -- wr_cnt advances with every response */
	op->rsp_wr.wr.next = NULL;
	*prev = &op->rsp_wr.wr;

	return ib_post_send(con->qp, first, NULL);
}

static void sdsrv_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdsrv_con *con = container_of(wc->wr_cqe, struct sdsrv_con, recv_cqe);
	struct sdsrv_path *path = con->path;
	struct sdsrv_msg_req *req;
	struct sdsrv_op *op;
	u32 msg_id;

	if (unlikely(wc->status != IB_WC_SUCCESS))
		return;
	if (sdsrv_post_recv(con))
		pr_err("sdsrv: con %u: recv repost failed\n", con->cid);
	if (con->cid == 0 || wc->opcode != IB_WC_RECV_RDMA_WITH_IMM)
		return;		/* service messages are handled by the info code */
	msg_id = be32_to_cpu(wc->ex.imm_data) >> 16;
	if (msg_id >= path->queue_depth)
		return;
	op = &path->ops[msg_id];
	req = page_address(path->chunks[msg_id]);
	op->con = con;
	op->msg_id = msg_id;
	op->dir = le32_to_cpu(req->dir);
	op->data_len = le32_to_cpu(req->data_len);
	op->remote_addr = le64_to_cpu(req->addr);
	op->remote_key = le32_to_cpu(req->key);
	if (op->data_len > path->chunk_size - sizeof(*req)) {
		sdsrv_send_io_resp(op, -EINVAL);
		return;
	}
	sdsrv_backend_submit(op, req + 1);
}

static void sdsrv_rsp_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR))
		pr_err("sdsrv: response failed: %s\n", ib_wc_status_msg(wc->status));
}

static void sdsrv_rearm_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("sdsrv: chunk re-arm failed: %s\n", ib_wc_status_msg(wc->status));
}

static void sdsrv_iu_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR))
		pr_err("sdsrv: service send failed: %s\n", ib_wc_status_msg(wc->status));
}

static void sdsrv_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdsrv_con *con = container_of(wc->wr_cqe, struct sdsrv_con, reg_cqe);
	struct sdsrv_path *path = con->path;

	if (wc->status != IB_WC_SUCCESS)
		pr_err("sdsrv: chunk registration failed: %s\n", ib_wc_status_msg(wc->status));
	if (atomic_dec_and_test(&path->regs_pending))
		wake_up(&path->regs_wait);
}

int sdsrv_open_path(struct sdsrv_path *path, struct rdma_cm_id **cm_ids, u32 con_num)
{
	u32 cid;
	int err;

	if (!path->queue_depth || path->queue_depth > SDSRV_SERVICE_DEPTH || !path->signal_interval)
		return -EINVAL;
	path->con = kcalloc(con_num, sizeof(*path->con), GFP_KERNEL);
	if (!path->con)
		return -ENOMEM;
	path->con_num = con_num;
	path->ops = kcalloc(path->queue_depth, sizeof(*path->ops), GFP_KERNEL);
	if (!path->ops)
		return -ENOMEM;
	init_waitqueue_head(&path->regs_wait);
	for (cid = 0; cid < con_num; cid++) {
		err = sdsrv_create_con(path, cm_ids[cid], cid);
		if (err)
			return err;	/* the caller closes the path */
	}
	err = sdsrv_map_chunks(path);
	if (err)
		return err;
	INIT_DELAYED_WORK(&path->hb_dwork, sdsrv_hb_work);
	queue_delayed_work(system_wq, &path->hb_dwork, msecs_to_jiffies(SDSRV_HB_INTERVAL_MS));
	return 0;
}

void sdsrv_close_path(struct sdsrv_path *path)
{
	u32 i;

	cancel_delayed_work_sync(&path->hb_dwork);
	for (i = 0; i < path->con_num; i++) {
		if (!path->con[i])
			continue;
		rdma_disconnect(path->con[i]->cm_id);
		ib_drain_qp(path->con[i]->qp);
	}
	if (path->mrs)
		sdsrv_unmap_chunks(path);
	for (i = 0; i < path->con_num; i++) {
		struct sdsrv_con *con = path->con[i];

		if (!con)
			continue;
		sdsrv_iu_free(con->hb_iu, path->ibdev);
		rdma_destroy_qp(con->cm_id);
		ib_cq_pool_put(con->cq, con->nr_cqe);
		rdma_destroy_id(con->cm_id);
		kfree(con);
	}
	kfree(path->con);
	path->con = NULL;
	kfree(path->ops);
	path->ops = NULL;
}

MODULE_DESCRIPTION("RTRS-style block transport server");
MODULE_LICENSE("GPL");
