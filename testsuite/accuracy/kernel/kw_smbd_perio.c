// SPDX-License-Identifier: GPL-2.0
/*
 * kwd -- SMB-Direct style client transport (smbdirect shaped).
 *
 * The server moves file data with RDMA READ/WRITE into buffers the client
 * exposes.  For each such I/O the client takes an MR from a list allocated
 * at connect time, registers the caller's pages with REG_MR chained in front
 * of the request SEND that carries the buffer descriptor, and invalidates it
 * when the response arrives unless the server already used SEND_WITH_INV.
 * MRs whose registration failed are rebuilt by a recovery work item.  The
 * send queue is accounted in work requests (sq_free): every read/write
 * request reserves its three WRs before posting, every plain message one.
 *
 * Correct: MR list setup/teardown, the recovery worker, credit-gated posting,
 * the signaling counter for plain messages, and the SGE limit checked at
 * connect time.  Not correct: when the list runs dry a temporary MR is
 * allocated in the submit path and deregistered in the receive handler; the
 * submit error paths leak that MR; and the access helper grants remote write
 * without local write.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed in this transport
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define KWD_SQ_SLOTS		128
#define KWD_WR_PER_RW		3	/* REG_MR + SEND + LOCAL_INV */
#define KWD_SIG_EVERY		8
#define KWD_MAX_SEND_SGE	6
#define KWD_RECV_DEPTH		255
#define KWD_RECV_SIZE		1364
#define KWD_HDR_SIZE		256

enum kwd_mr_state {
	KWD_MR_READY,
	KWD_MR_REGISTERED,
	KWD_MR_ERROR,
};

struct kwd_buffer_desc {
	__le64	offset;
	__le32	token;
	__le32	length;
};

struct kwd_conn;

struct kwd_mr {
	struct kwd_conn		*conn;
	struct list_head	list;
	struct ib_mr		*mr;
	enum kwd_mr_state	state;
};

struct kwd_req {
	struct kwd_conn		*conn;
	u64			msg_id;
	void			*hdr;
	u64			hdr_dma;
	u32			hdr_len;
	struct kwd_buffer_desc	*desc;
	struct ib_sge		sge;
	struct ib_send_wr	wr;
	struct ib_cqe		cqe;
	int			sq_batch;

	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct kwd_mr		*mr_desc;
	struct ib_mr		*tmp_mr;
	struct scatterlist	*sgl;
	int			nents;
	enum dma_data_direction	dir;
	void			(*done)(struct kwd_req *req, int status);
};

struct kwd_conn {
	struct rdma_cm_id	*id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct ib_qp		*qp;

	u32			max_frmr_depth;
	int			nr_mrs;
	struct kwd_mr		*mrs;
	spinlock_t		mr_lock;
	struct list_head	mr_ready;
	struct work_struct	mr_recovery_work;

	spinlock_t		sq_lock;
	int			sq_free;
	int			sq_unsig_wrs;
	unsigned int		sends_since_sig;
};

struct kwd_resp {
	struct kwd_conn		*conn;
	void			*buf;
	u64			dma;
	struct ib_cqe		cqe;
};

/* smb layer */
struct kwd_req *kwd_find_req(struct kwd_conn *conn, u64 msg_id);
u64 kwd_resp_msg_id(struct kwd_resp *resp);
void kwd_repost_resp(struct kwd_conn *conn, struct kwd_resp *resp);

static void kwd_send_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwd_reg_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwd_inv_done(struct ib_cq *cq, struct ib_wc *wc);

static void kwd_sq_put(struct kwd_conn *conn, int n)
{
	spin_lock(&conn->sq_lock);
	conn->sq_free += n;
	spin_unlock(&conn->sq_lock);
}

/* DMA_FROM_DEVICE: the server RDMA-writes into our pages */
static int kwd_mr_access(enum dma_data_direction dir)
{
	if (dir == DMA_FROM_DEVICE)
		return IB_ACCESS_REMOTE_WRITE;
	return IB_ACCESS_REMOTE_READ;
}

static int kwd_alloc_mr_list(struct kwd_conn *conn)
{
	int i;

	conn->mrs = kcalloc(conn->nr_mrs, sizeof(*conn->mrs), GFP_KERNEL);
	if (!conn->mrs)
		return -ENOMEM;

	for (i = 0; i < conn->nr_mrs; i++) {
		struct kwd_mr *m = &conn->mrs[i];

		m->conn = conn;
		m->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_frmr_depth);	// OK: rdma-registration-in-datapath -- the list is built once at connect time
		if (IS_ERR(m->mr))
			goto out_unwind;
		m->state = KWD_MR_READY;
		list_add_tail(&m->list, &conn->mr_ready);
	}
	return 0;

out_unwind:
	while (--i >= 0)
		ib_dereg_mr(conn->mrs[i].mr);
	kfree(conn->mrs);
	conn->mrs = NULL;
	INIT_LIST_HEAD(&conn->mr_ready);
	return -ENOMEM;	// OK: rdma-mr-leak -- element i failed to allocate; every earlier one is deregistered above
}

static void kwd_free_mr_list(struct kwd_conn *conn)
{
	int i;

	cancel_work_sync(&conn->mr_recovery_work);
	for (i = 0; i < conn->nr_mrs; i++)
		if (conn->mrs[i].mr)
			ib_dereg_mr(conn->mrs[i].mr);
	kfree(conn->mrs);
	conn->mrs = NULL;
}

/* Rebuild MRs whose registration completed in error. */
static void kwd_mr_recovery_work(struct work_struct *work)
{
	struct kwd_conn *conn = container_of(work, struct kwd_conn, mr_recovery_work);
	struct ib_mr *mr;
	int i;

	for (i = 0; i < conn->nr_mrs; i++) {
		struct kwd_mr *m = &conn->mrs[i];

		if (m->state != KWD_MR_ERROR)
			continue;
		ib_dereg_mr(m->mr);
		m->mr = NULL;
		mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_frmr_depth);	// OK: rdma-registration-in-datapath -- runs from the recovery worker, only for MRs that failed
		if (IS_ERR(mr)) {
			pr_warn("kwd: MR recovery failed: %ld\n", PTR_ERR(mr));
			continue;
		}
		m->mr = mr;
		spin_lock(&conn->mr_lock);
		m->state = KWD_MR_READY;
		list_add_tail(&m->list, &conn->mr_ready);
		spin_unlock(&conn->mr_lock);
	}
}

static struct kwd_mr *kwd_get_mr(struct kwd_conn *conn)
{
	struct kwd_mr *m = NULL;

	spin_lock(&conn->mr_lock);
	if (!list_empty(&conn->mr_ready)) {
		m = list_first_entry(&conn->mr_ready, struct kwd_mr, list);
		list_del_init(&m->list);
		m->state = KWD_MR_REGISTERED;
	}
	spin_unlock(&conn->mr_lock);
	return m;
}

static void kwd_put_mr(struct kwd_conn *conn, struct kwd_mr *m)
{
	spin_lock(&conn->mr_lock);
	m->state = KWD_MR_READY;
	list_add_tail(&m->list, &conn->mr_ready);
	spin_unlock(&conn->mr_lock);
}

/*
 * Register req->sgl for the server's RDMA READ (we write) or RDMA WRITE (we
 * read) and send the request that carries the buffer descriptor.
 */
int kwd_submit_rw(struct kwd_conn *conn, struct kwd_req *req)
{
	struct ib_mr *mr;
	int n, rc;

	spin_lock(&conn->sq_lock);
	if (conn->sq_free < KWD_WR_PER_RW) {
		spin_unlock(&conn->sq_lock);
		return -EAGAIN;
	}
	conn->sq_free -= KWD_WR_PER_RW;
	spin_unlock(&conn->sq_lock);

	req->tmp_mr = NULL;
	req->mr_desc = kwd_get_mr(conn);
	if (req->mr_desc) {
		mr = req->mr_desc->mr;
	} else {
		/* list exhausted under a burst: don't stall the caller */
		mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_frmr_depth);	// BUG: rdma-registration-in-datapath -- an MR is allocated per I/O in the submit path
		if (IS_ERR(mr)) {
			rc = PTR_ERR(mr);
			goto out_credits;
		}
		req->tmp_mr = mr;
	}

	n = ib_dma_map_sg(conn->dev, req->sgl, req->nents, req->dir);
	if (!n) {
		rc = -EIO;
		goto out_put;
	}
	rc = ib_map_mr_sg(mr, req->sgl, n, NULL, PAGE_SIZE);
	if (rc != n) {
		rc = rc < 0 ? rc : -EINVAL;
		goto out_unmap;
	}

	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_cqe.done = kwd_reg_done;
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = mr;
	req->reg_wr.key = mr->rkey;
	req->reg_wr.access = kwd_mr_access(req->dir);	// BUG: rdma-access-flags-invalid -- for DMA_FROM_DEVICE kwd_mr_access() returns IB_ACCESS_REMOTE_WRITE without IB_ACCESS_LOCAL_WRITE

	req->desc->offset = cpu_to_le64(mr->iova);
	req->desc->token = cpu_to_le32(mr->rkey);
	req->desc->length = cpu_to_le32(mr->length);
	ib_dma_sync_single_for_device(conn->dev, req->hdr_dma, req->hdr_len,
				      DMA_TO_DEVICE);

	req->sge.addr = req->hdr_dma;
	req->sge.length = req->hdr_len;
	req->sge.lkey = conn->pd->local_dma_lkey;
	req->cqe.done = kwd_send_done;
	req->wr.next = NULL;
	req->wr.wr_cqe = &req->cqe;
	req->wr.sg_list = &req->sge;
	req->wr.num_sge = 1;
	req->wr.opcode = IB_WR_SEND;
	req->wr.send_flags = IB_SEND_SIGNALED;
	req->reg_wr.wr.next = &req->wr;

	spin_lock(&conn->sq_lock);
	req->sq_batch = conn->sq_unsig_wrs + KWD_WR_PER_RW - 1;
	conn->sq_unsig_wrs = 0;
	conn->sends_since_sig = 0;
	spin_unlock(&conn->sq_lock);

	rc = ib_post_send(conn->qp, &req->reg_wr.wr, NULL);	// OK: rdma-send-queue-undersized -- REG_MR, SEND and the later LOCAL_INV are reserved from sq_free above
	if (rc)
		goto out_unmap;
	return 0;

out_unmap:
	ib_dma_unmap_sg(conn->dev, req->sgl, req->nents, req->dir);
out_put:
	if (req->mr_desc) {
		kwd_put_mr(conn, req->mr_desc);
		req->mr_desc = NULL;
	}
out_credits:
	kwd_sq_put(conn, KWD_WR_PER_RW);
	return rc;	// BUG: rdma-mr-leak -- a temporary MR held in req->tmp_mr is never deregistered on these error paths
}

/* Plain message (negotiate, credits, echo): one WR. */
int kwd_post_msg(struct kwd_conn *conn, struct kwd_req *req)
{
	spin_lock(&conn->sq_lock);
	if (conn->sq_free < 1) {
		spin_unlock(&conn->sq_lock);
		return -EAGAIN;
	}
	conn->sq_free -= 1;
	conn->sq_unsig_wrs++;
	req->wr.send_flags = 0;
	req->sq_batch = 0;
	if (++conn->sends_since_sig >= KWD_SIG_EVERY) {	// OK: rdma-unsignaled-send-starvation -- the counter advances on every message, so every eighth one is signaled
		req->wr.send_flags = IB_SEND_SIGNALED;
		req->sq_batch = conn->sq_unsig_wrs;
		conn->sq_unsig_wrs = 0;
		conn->sends_since_sig = 0;
	}
	spin_unlock(&conn->sq_lock);

	req->sge.addr = req->hdr_dma;
	req->sge.length = req->hdr_len;
	req->sge.lkey = conn->pd->local_dma_lkey;
	req->cqe.done = kwd_send_done;
	req->wr.next = NULL;
	req->wr.wr_cqe = &req->cqe;
	req->wr.sg_list = &req->sge;
	req->wr.num_sge = 1;
	req->wr.opcode = IB_WR_SEND;
	return ib_post_send(conn->qp, &req->wr, NULL);
}

static void kwd_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwd_req *req = container_of(wc->wr_cqe, struct kwd_req, cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kwd: send failed: %s\n", ib_wc_status_msg(wc->status));
	kwd_sq_put(req->conn, req->sq_batch);
}

static void kwd_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwd_req *req = container_of(wc->wr_cqe, struct kwd_req, reg_cqe);

	if (wc->status == IB_WC_SUCCESS)
		return;
	pr_err("kwd: REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
	if (req->mr_desc) {
		req->mr_desc->state = KWD_MR_ERROR;
		req->mr_desc = NULL;
		queue_work(system_wq, &req->conn->mr_recovery_work);
	}
}

static void kwd_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwd_req *req = container_of(wc->wr_cqe, struct kwd_req, inv_cqe);
	struct kwd_conn *conn = req->conn;

	kwd_sq_put(conn, 1);
	ib_dma_unmap_sg(conn->dev, req->sgl, req->nents, req->dir);
	if (wc->status != IB_WC_SUCCESS) {
		req->mr_desc->state = KWD_MR_ERROR;
		queue_work(system_wq, &conn->mr_recovery_work);
	} else {
		kwd_put_mr(conn, req->mr_desc);
	}
	req->mr_desc = NULL;
	req->done(req, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}

/* The response to a read/write request arrived. */
void kwd_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwd_resp *resp = container_of(wc->wr_cqe, struct kwd_resp, cqe);
	struct kwd_conn *conn = resp->conn;
	struct kwd_req *req;
	int rc;

	if (wc->status != IB_WC_SUCCESS)
		return;
	req = kwd_find_req(conn, kwd_resp_msg_id(resp));
	kwd_repost_resp(conn, resp);
	if (!req)
		return;

	if (req->tmp_mr) {
		ib_dereg_mr(req->tmp_mr);	// BUG: rdma-registration-in-datapath -- the per-I/O MR is deregistered in the receive completion handler
		req->tmp_mr = NULL;
		ib_dma_unmap_sg(conn->dev, req->sgl, req->nents, req->dir);
		kwd_sq_put(conn, 1);
		req->done(req, 0);
		return;
	}

	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
	    wc->ex.invalidate_rkey == req->mr_desc->mr->rkey) {
		ib_dma_unmap_sg(conn->dev, req->sgl, req->nents, req->dir);
		kwd_put_mr(conn, req->mr_desc);
		req->mr_desc = NULL;
		kwd_sq_put(conn, 1);
		req->done(req, 0);
		return;
	}

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_cqe.done = kwd_inv_done;
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.ex.invalidate_rkey = req->mr_desc->mr->rkey;
	rc = ib_post_send(conn->qp, &req->inv_wr, NULL);
	if (rc) {
		req->mr_desc->state = KWD_MR_ERROR;
		req->mr_desc = NULL;
		queue_work(system_wq, &conn->mr_recovery_work);
		kwd_sq_put(conn, 1);
		req->done(req, rc);
	}
}

static int kwd_create_qp(struct kwd_conn *conn)
{
	struct ib_qp_init_attr attr;
	int rc;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = conn;
	attr.send_cq = conn->send_cq;
	attr.recv_cq = conn->recv_cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	/* OK: rdma-send-queue-undersized -- posts never exceed sq_free, which starts at KWD_SQ_SLOTS; the extra entry is for ib_drain_qp() */
	attr.cap.max_send_wr = KWD_SQ_SLOTS + 1;
	attr.cap.max_recv_wr = KWD_RECV_DEPTH;
	attr.cap.max_send_sge = KWD_MAX_SEND_SGE;	// OK: rdma-queue-cap-unchecked -- kwd_connect() refuses devices with fewer send SGEs before calling here
	attr.cap.max_recv_sge = 1;

	rc = rdma_create_qp(conn->id, conn->pd, &attr);
	if (rc)
		return rc;
	conn->qp = conn->id->qp;
	conn->sq_free = KWD_SQ_SLOTS;
	conn->sq_unsig_wrs = 0;
	conn->sends_since_sig = 0;
	return 0;
}

int kwd_connect(struct kwd_conn *conn, struct rdma_cm_id *id, struct ib_pd *pd,
		int responder_resources)
{
	struct ib_device *dev = id->device;
	int rc;

	if (dev->attrs.max_send_sge < KWD_MAX_SEND_SGE) {
		pr_err("kwd: %s offers %d send SGEs, need %d\n", dev->name,
		       dev->attrs.max_send_sge, KWD_MAX_SEND_SGE);
		return -EOPNOTSUPP;
	}

	conn->id = id;
	conn->dev = dev;
	conn->pd = pd;
	conn->max_frmr_depth = min_t(u32, 2048, dev->attrs.max_fast_reg_page_list_len);
	conn->nr_mrs = responder_resources * 2;
	spin_lock_init(&conn->mr_lock);
	spin_lock_init(&conn->sq_lock);
	INIT_LIST_HEAD(&conn->mr_ready);
	INIT_WORK(&conn->mr_recovery_work, kwd_mr_recovery_work);

	conn->send_cq = ib_alloc_cq(dev, conn, KWD_SQ_SLOTS + 1, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(conn->send_cq))
		return PTR_ERR(conn->send_cq);
	conn->recv_cq = ib_alloc_cq(dev, conn, KWD_RECV_DEPTH, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(conn->recv_cq)) {
		rc = PTR_ERR(conn->recv_cq);
		goto out_send_cq;
	}
	rc = kwd_create_qp(conn);
	if (rc)
		goto out_recv_cq;
	rc = kwd_alloc_mr_list(conn);
	if (rc)
		goto out_qp;
	return 0;

out_qp:
	rdma_destroy_qp(id);
out_recv_cq:
	ib_free_cq(conn->recv_cq);
out_send_cq:
	ib_free_cq(conn->send_cq);
	return rc;
}

void kwd_disconnect(struct kwd_conn *conn)
{
	rdma_disconnect(conn->id);
	ib_drain_qp(conn->qp);
	kwd_free_mr_list(conn);
	rdma_destroy_qp(conn->id);
	ib_free_cq(conn->recv_cq);
	ib_free_cq(conn->send_cq);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kwd SMB-Direct style client transport");
