// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * kc_smbd_client.c - SMB Direct style client (fs/smb/client/smbdirect.c style).
 * SMB2 READ/WRITE payloads are fast-registered from an MR list (READY ->
 * REGISTERED -> INVALIDATED -> READY, ERROR MRs rebuilt by a work item); SMB
 * 3.02+ servers invalidate with SEND_WITH_INV, for 3.0 the client LOCAL_INVs.
 * Known problems: SQ counts only send credits; the signal counter never moves;
 * READ responses accept any remote invalidation; a timed-out LOCAL_INV counts
 * as done; an unsent request recycles its live MR; one-off MRs are allocated
 * per I/O when the list is empty; the list allocation leaks an MR.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <rdma/rdma_cm.h>

#define KC_SMBD_MAX_SEND_SGE	6
#define KC_SMBD_IWARP_IRD	8
#define KC_SMBD_SIGNAL_BATCH	16
#define KC_SMBD_INV_TIMEOUT_MS	5000
#define KC_SMBD_MAX_REQS	128
#define KC_SMB30_DIALECT	0x0300	/* no remote invalidation */

enum kc_smbd_mr_state { KC_MR_READY, KC_MR_REGISTERED, KC_MR_INVALIDATED, KC_MR_ERROR };

struct kc_smbd_mr {
	struct kc_smbd_conn	*conn;
	struct list_head	list;
	enum kc_smbd_mr_state	state;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	bool			need_invalidate, oneshot;
	struct ib_reg_wr	wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	invalidate_done;
};

struct kc_smbd_buffer_desc {		/* SMB2 channel info */
	__le64	offset;
	__le32	token, length;
};

struct kc_smbd_req {
	struct kc_smbd_mr	*mr;
	struct page		**pages;
	int			npages;
	u64			hdr_dma;
	u32			hdr_len;
	struct kc_smbd_buffer_desc *desc;
	struct ib_cqe		send_cqe;
	struct completion	done;
	int			status;
};

struct kc_smbd_response {
	struct ib_cqe		cqe;
	struct kc_smbd_conn	*conn;
	u64			mid;
	u16			command;
	int			status;
	int			wc_flags;	/* copied from the receive completion */
	u32			inv_rkey;
};

struct kc_smbd_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*send_cq, *recv_cq;
	u16			dialect;
	u32			send_credit_target, recv_credit_max;
	u32			responder_resources, mr_count, max_frmr_depth;
	enum ib_mr_type		mr_type;
	unsigned int		sends_since_signal;
	spinlock_t		mr_list_lock;
	struct list_head	mr_list;
	atomic_t		mr_ready_count;
	wait_queue_head_t	wait_mr;
	struct work_struct	mr_recovery_work;
	struct workqueue_struct	*wq;
	struct kc_smbd_req	reqs[KC_SMBD_MAX_REQS];
};

void kc_smbd_disconnect(struct kc_smbd_conn *conn);

int kc_smbd_create_qp(struct kc_smbd_conn *conn)
{
	struct ib_qp_init_attr qp_attr = {};
	int rc;

	if (KC_SMBD_MAX_SEND_SGE > conn->ibdev->attrs.max_send_sge)
		return -EINVAL;		/* device max_send_sge too small */
	/* OK: rdma-access-flags-transport -- the iWARP test only sizes the IRD, it decides no access flags */
	if (rdma_protocol_iwarp(conn->ibdev, conn->cm_id->port_num))
		conn->responder_resources = min_t(u32, conn->responder_resources,
						  KC_SMBD_IWARP_IRD);
	conn->mr_count = conn->responder_resources * 2;

	/* BUG(file): rdma-send-queue-undersized -- one entry per send credit, but every offloaded I/O also queues a REG_MR and a LOCAL_INV on this QP */
	qp_attr.cap.max_send_wr = conn->send_credit_target;
	qp_attr.cap.max_recv_wr = conn->recv_credit_max;
	qp_attr.cap.max_send_sge = KC_SMBD_MAX_SEND_SGE; /* OK: rdma-queue-cap-unchecked -- compared with attrs.max_send_sge above */
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = conn->send_cq;
	qp_attr.recv_cq = conn->recv_cq;

	rc = rdma_create_qp(conn->cm_id, conn->pd, &qp_attr);
	if (rc)
		return rc;
	conn->qp = conn->cm_id->qp;
	return 0;
}

static int kc_smbd_post_send(struct kc_smbd_conn *conn, u64 addr, u32 len,
			     struct ib_cqe *cqe)
{
	struct ib_sge sge = {
		.addr = addr,
		.length = len,
		.lkey = conn->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_cqe = cqe,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IB_WR_SEND,
	};

	/* a completion every KC_SMBD_SIGNAL_BATCH sends; send_done frees the batch */
	if (conn->sends_since_signal == KC_SMBD_SIGNAL_BATCH) { /* BUG(file): rdma-unsignaled-send-starvation -- sends_since_signal is reset but never incremented, so no SEND is ever signaled */
		wr.send_flags = IB_SEND_SIGNALED;
		conn->sends_since_signal = 0;
	}
	return ib_post_send(conn->qp, &wr, NULL);
}

int kc_smbd_alloc_mr_list(struct kc_smbd_conn *conn)
{
	struct kc_smbd_mr *m, *tmp;
	int i;

	INIT_LIST_HEAD(&conn->mr_list);
	for (i = 0; i < conn->mr_count; i++) {
		m = kzalloc(sizeof(*m), GFP_KERNEL);
		if (!m)
			goto out;
		m->mr = ib_alloc_mr(conn->pd, conn->mr_type, conn->max_frmr_depth);
		if (IS_ERR(m->mr)) {
			kfree(m);
			goto out;
		}
		m->sgl = kcalloc(conn->max_frmr_depth, sizeof(*m->sgl),
				 GFP_KERNEL);
		if (!m->sgl) {
			kfree(m); /* BUG: rdma-mr-leak -- m->mr from ib_alloc_mr() goes down with its holder */
			goto out;
		}
		m->conn = conn;
		m->state = KC_MR_READY;
		list_add_tail(&m->list, &conn->mr_list);
		atomic_inc(&conn->mr_ready_count);
	}
	return 0;

out:
	list_for_each_entry_safe(m, tmp, &conn->mr_list, list) {
		list_del(&m->list);
		ib_dereg_mr(m->mr);
		kfree(m->sgl);
		kfree(m);
	}
	return -ENOMEM;
}

/* INIT_WORK()ed on conn->mr_recovery_work by the connection setup */
void kc_smbd_mr_recovery_work(struct work_struct *work)
{
	struct kc_smbd_conn *conn =
		container_of(work, struct kc_smbd_conn, mr_recovery_work);
	struct kc_smbd_mr *m;

	list_for_each_entry(m, &conn->mr_list, list) {
		if (m->state != KC_MR_ERROR)
			continue;
		/* recover this MR entry, off the I/O path */
		if (ib_dereg_mr(m->mr)) {
			kc_smbd_disconnect(conn);
			continue;
		}
		ib_dma_unmap_sg(conn->ibdev, m->sgl, m->sgl_count, m->dir); /* OK: rdma-invalidation-leak -- deregistered first, the key is dead */
		/* OK: rdma-registration-in-datapath -- recovery runs from a work item, not per I/O */
		m->mr = ib_alloc_mr(conn->pd, conn->mr_type, conn->max_frmr_depth); /* OK: rdma-mr-leak -- the old MR was deregistered above */
		if (IS_ERR(m->mr)) {
			kc_smbd_disconnect(conn);
			continue;
		}
		m->state = KC_MR_READY;
		if (atomic_inc_return(&conn->mr_ready_count) == 1)
			wake_up(&conn->wait_mr);
	}
}

static struct kc_smbd_mr *kc_smbd_get_mr(struct kc_smbd_conn *conn)
{
	struct kc_smbd_mr *m;
	unsigned long flags;

	spin_lock_irqsave(&conn->mr_list_lock, flags);
	list_for_each_entry(m, &conn->mr_list, list) {
		if (m->state == KC_MR_READY) {
			m->state = KC_MR_REGISTERED;
			spin_unlock_irqrestore(&conn->mr_list_lock, flags);
			atomic_dec(&conn->mr_ready_count);
			return m;
		}
	}
	spin_unlock_irqrestore(&conn->mr_list_lock, flags);
	return NULL;
}

/* Every list MR is in flight: give this I/O a one-off MR. */
static struct kc_smbd_mr *kc_smbd_alloc_oneshot(struct kc_smbd_conn *conn,
						int nents)
{
	struct kc_smbd_mr *m;

	m = kzalloc(sizeof(*m) + nents * sizeof(struct scatterlist), GFP_NOIO);
	if (!m)
		return NULL;
	m->mr = ib_alloc_mr(conn->pd, conn->mr_type, nents); /* BUG: rdma-registration-in-datapath -- an MR allocated for a single I/O on the submit path */
	if (IS_ERR(m->mr)) {
		kfree(m);
		return NULL;
	}
	m->sgl = (struct scatterlist *)(m + 1);
	m->conn = conn;
	m->oneshot = true;
	m->state = KC_MR_REGISTERED;
	return m;
}

static void kc_smbd_free_oneshot(struct kc_smbd_mr *m)
{
	ib_dereg_mr(m->mr); /* BUG: rdma-registration-in-datapath -- the one-off MR is deregistered again at the end of its I/O */
	kfree(m);
}

static void kc_smbd_register_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_smbd_mr *m = container_of(wc->wr_cqe, struct kc_smbd_mr, cqe);

	if (wc->status)
		kc_smbd_disconnect(m->conn);
}

static void kc_smbd_local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_smbd_mr *m = container_of(wc->wr_cqe, struct kc_smbd_mr, cqe);

	m->state = wc->status ? KC_MR_ERROR : KC_MR_INVALIDATED;
	complete(&m->invalidate_done);
}

struct kc_smbd_mr *kc_smbd_register_mr(struct kc_smbd_conn *conn,
				       struct page **pages, int num_pages,
				       bool writing, bool need_invalidate)
{
	struct kc_smbd_mr *m;
	struct ib_reg_wr *reg_wr;
	int rc, i;

	m = kc_smbd_get_mr(conn);
	if (!m)
		m = kc_smbd_alloc_oneshot(conn, num_pages);
	if (!m)
		return NULL;

	m->need_invalidate = need_invalidate;
	m->sgl_count = num_pages;
	sg_init_table(m->sgl, num_pages);
	for (i = 0; i < num_pages; i++)
		sg_set_page(&m->sgl[i], pages[i], PAGE_SIZE, 0);
	m->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;

	rc = ib_dma_map_sg(conn->ibdev, m->sgl, num_pages, m->dir);
	if (!rc)
		goto dma_map_error;
	rc = ib_map_mr_sg(m->mr, m->sgl, num_pages, NULL, PAGE_SIZE);
	if (rc != num_pages)
		goto map_mr_error;

	ib_update_fast_reg_key(m->mr, ib_inc_rkey(m->mr->rkey));
	reg_wr = &m->wr;
	reg_wr->wr.opcode = IB_WR_REG_MR;
	m->cqe.done = kc_smbd_register_done;
	reg_wr->wr.wr_cqe = &m->cqe;
	reg_wr->wr.num_sge = 0;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = m->mr; /* OK: rdma-rkey-reuse -- ib_inc_rkey() before every registration */
	reg_wr->key = m->mr->rkey;
	reg_wr->access = writing ? /* OK: rdma-access-flags-invalid -- REMOTE_WRITE comes with LOCAL_WRITE */
		IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
		IB_ACCESS_REMOTE_READ;

	rc = ib_post_send(conn->qp, &reg_wr->wr, NULL);
	if (!rc)
		return m;

map_mr_error:
	ib_dma_unmap_sg(conn->ibdev, m->sgl, m->sgl_count, m->dir); /* OK: rdma-invalidation-leak -- the REG_MR was never posted */
dma_map_error:
	m->sgl_count = 0;
	if (m->oneshot)
		kc_smbd_free_oneshot(m);
	else
		m->state = KC_MR_ERROR;
	kc_smbd_disconnect(conn);
	return NULL;
}

void kc_smbd_deregister_mr(struct kc_smbd_mr *m)
{
	struct kc_smbd_conn *conn = m->conn;
	struct ib_send_wr *wr = &m->inv_wr;
	int rc;

	if (m->need_invalidate) {
		memset(wr, 0, sizeof(*wr));
		m->cqe.done = kc_smbd_local_inv_done;
		wr->wr_cqe = &m->cqe;
		wr->opcode = IB_WR_LOCAL_INV;
		wr->ex.invalidate_rkey = m->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;
		init_completion(&m->invalidate_done);
		rc = ib_post_send(conn->qp, wr, NULL);
		if (rc) {
			kc_smbd_disconnect(conn);
			return;
		}
		/* don't hang the caller on a dying connection */
		if (!wait_for_completion_timeout(&m->invalidate_done,
				msecs_to_jiffies(KC_SMBD_INV_TIMEOUT_MS)))
			m->state = KC_MR_INVALIDATED;
		m->need_invalidate = false;
	}

	if (m->state == KC_MR_INVALIDATED) {
		/* BUG: rdma-unmap-before-invalidate -- after a timed-out wait the LOCAL_INV may still be pending when the pages are unmapped and the MR handed out again */
		ib_dma_unmap_sg(conn->ibdev, m->sgl, m->sgl_count, m->dir);
		if (m->oneshot) {
			kc_smbd_free_oneshot(m);
			return;
		}
		m->state = KC_MR_READY;
		if (atomic_inc_return(&conn->mr_ready_count) == 1)
			wake_up(&conn->wait_mr);
	} else if (m->oneshot) {
		kc_smbd_free_oneshot(m);
	} else {
		m->state = KC_MR_ERROR;	/* recovery deregisters it */
		queue_work(conn->wq, &conn->mr_recovery_work);
	}
}

/* SMB2 READ: the server RDMA WRITEs into our pages, SMB2 WRITE: it READs them. */
int kc_smbd_issue_rdma(struct kc_smbd_conn *conn, struct kc_smbd_req *req,
		       bool read)
{
	struct kc_smbd_mr *m;
	int rc;

	m = kc_smbd_register_mr(conn, req->pages, req->npages, read,
				conn->dialect == KC_SMB30_DIALECT);
	if (!m)
		return -EAGAIN;
	req->mr = m;
	req->desc->offset = cpu_to_le64(m->mr->iova);
	req->desc->token = cpu_to_le32(m->mr->rkey);
	req->desc->length = cpu_to_le32(m->mr->length);
	init_completion(&req->done);
	rc = kc_smbd_post_send(conn, req->hdr_dma, req->hdr_len, &req->send_cqe);
	if (rc) {
		/* the request never reached the server, nothing to invalidate */
		m->need_invalidate = false;
		m->state = KC_MR_INVALIDATED;
		kc_smbd_deregister_mr(m); /* BUG: rdma-invalidation-leak -- the REG_MR was posted, the key is live in the device; the MR is unmapped and recycled without a LOCAL_INV */
		return rc;
	}

	wait_for_completion(&req->done);
	kc_smbd_deregister_mr(m);
	return req->status;
}

static void kc_smbd_read_rsp(struct kc_smbd_response *resp,
			     struct kc_smbd_req *req)
{
	/* the server invalidated our buffer with SEND_WITH_INV */
	if (resp->wc_flags & IB_WC_WITH_INVALIDATE) /* BUG: rdma-remote-invalidate-unchecked -- resp->inv_rkey is never compared with the MR's rkey */
		req->mr->state = KC_MR_INVALIDATED;
}

static void kc_smbd_write_rsp(struct kc_smbd_response *resp,
			      struct kc_smbd_req *req)
{
	/* OK: rdma-remote-invalidate-unchecked -- only the request's own rkey counts */
	if ((resp->wc_flags & IB_WC_WITH_INVALIDATE) &&
	    resp->inv_rkey == req->mr->mr->rkey)
		req->mr->state = KC_MR_INVALIDATED;
}

void kc_smbd_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_smbd_response *resp =
		container_of(wc->wr_cqe, struct kc_smbd_response, cqe);
	struct kc_smbd_conn *conn = resp->conn;
	struct kc_smbd_req *req;

	if (wc->status != IB_WC_SUCCESS || wc->opcode != IB_WC_RECV) {
		kc_smbd_disconnect(conn);
		return;
	}
	resp->wc_flags = wc->wc_flags;
	resp->inv_rkey = wc->ex.invalidate_rkey;

	req = &conn->reqs[resp->mid % KC_SMBD_MAX_REQS];
	if (req->mr) {
		if (resp->command == 0x0008)		/* SMB2 READ */
			kc_smbd_read_rsp(resp, req);
		else if (resp->command == 0x0009)	/* SMB2 WRITE */
			kc_smbd_write_rsp(resp, req);
	}
	req->status = resp->status;
	complete(&req->done);
}

MODULE_LICENSE("GPL");
