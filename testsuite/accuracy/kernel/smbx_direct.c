// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * smbx_direct.c - memory registration of the SMBX Direct client transport.
 *
 * The client registers the pages of a large READ or WRITE with one of the
 * connection's fast-registration MRs and sends the server a buffer
 * descriptor (offset, token, length).  The MRs are allocated when the
 * connection is negotiated, kept in a table and lent out one per I/O.
 * Dialects that support it let the server invalidate the token with the
 * response (SEND_WITH_INVALIDATE); otherwise the client posts a LOCAL_INV
 * and waits for it before the pages are released.  An MR that failed is
 * marked and rebuilt by the recovery worker.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SMBX_MAX_SEND_SGE	6
#define SMBX_MAX_RECV_SGE	1
#define SMBX_REG_TIMEOUT_MS	5000

enum smbx_mr_state { MR_READY, MR_REGISTERED, MR_INVALIDATED, MR_ERROR };

struct smbx_buffer_desc {
	__le64	offset;
	__le32	token;
	__le32	length;
};

struct smbx_conn;

struct smbx_mr {
	struct smbx_conn	*conn;
	struct list_head	list;
	enum smbx_mr_state	state;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	struct ib_reg_wr	wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	done;
};

struct smbx_conn {
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq, *recv_cq;
	struct ib_qp		*qp;
	int			send_credit_target;
	int			receive_credit_max;
	int			max_frmr_depth;
	int			mr_count;
	struct smbx_mr		*mrs;
	spinlock_t		mr_lock;
	struct list_head	mr_ready;
	wait_queue_head_t	wait_mr;
	struct work_struct	mr_recovery_work;
};

int smbx_create_qp(struct smbx_conn *conn)
{
	struct ib_device *dev = conn->id->device;
	struct ib_qp_init_attr qp_attr;

	if (dev->attrs.max_send_sge < SMBX_MAX_SEND_SGE ||
	    dev->attrs.max_recv_sge < SMBX_MAX_RECV_SGE)
		return -EINVAL;

	memset(&qp_attr, 0, sizeof(qp_attr));
	/* BUG(file): rdma-send-queue-undersized -- only the SEND credits are counted: every I/O also posts a REG_MR and a LOCAL_INV, and ib_drain_qp() finds no free entry */
	qp_attr.cap.max_send_wr = conn->send_credit_target;
	qp_attr.cap.max_recv_wr = conn->receive_credit_max;
	qp_attr.cap.max_send_sge = SMBX_MAX_SEND_SGE; /* OK: rdma-queue-cap-unchecked -- attrs.max_send_sge was compared above */
	qp_attr.cap.max_recv_sge = SMBX_MAX_RECV_SGE;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = conn->send_cq;
	qp_attr.recv_cq = conn->recv_cq;
	return rdma_create_qp(conn->id, conn->pd, &qp_attr);
}

static void smbx_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbx_mr *mr = container_of(wc->wr_cqe, struct smbx_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		mr->state = MR_ERROR;
		queue_work(system_wq, &mr->conn->mr_recovery_work);
	}
	complete(&mr->done);
}

int smbx_allocate_mr_list(struct smbx_conn *conn)
{
	int i;

	conn->mrs = kcalloc(conn->mr_count, sizeof(*conn->mrs), GFP_KERNEL);
	if (!conn->mrs)
		return -ENOMEM;

	for (i = 0; i < conn->mr_count; i++) {
		struct smbx_mr *mr = &conn->mrs[i];

		/* BUG: rdma-local-mr-management -- the transport allocates its own FRWR MRs */
		mr->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_frmr_depth);
		if (IS_ERR(mr->mr))
			goto out;
		mr->sgl = kcalloc(conn->max_frmr_depth, sizeof(*mr->sgl), GFP_KERNEL);
		if (!mr->sgl)
			goto out; // BUG: rdma-mr-leak -- the unwinding below stops before index i, whose MR is already allocated
		mr->conn = conn;
		mr->state = MR_READY;
		init_completion(&mr->done);
		list_add_tail(&mr->list, &conn->mr_ready);
	}
	return 0;

out:
	while (i--) {
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(conn->mrs[i].mr);
		kfree(conn->mrs[i].sgl);
	}
	kfree(conn->mrs);
	return -ENOMEM;
}

static struct smbx_mr *smbx_get_mr(struct smbx_conn *conn)
{
	struct smbx_mr *mr;

	wait_event(conn->wait_mr, !list_empty(&conn->mr_ready));
	spin_lock(&conn->mr_lock);
	mr = list_first_entry_or_null(&conn->mr_ready, struct smbx_mr, list);
	if (mr)
		list_del(&mr->list);
	spin_unlock(&conn->mr_lock);
	return mr;
}

static void smbx_put_mr(struct smbx_conn *conn, struct smbx_mr *mr)
{
	spin_lock(&conn->mr_lock);
	list_add_tail(&mr->list, &conn->mr_ready);
	spin_unlock(&conn->mr_lock);
	wake_up(&conn->wait_mr);
}

static void smbx_recycle_mr(struct smbx_conn *conn, struct smbx_mr *mr)
{
	ib_dma_unmap_sg(conn->id->device, mr->sgl, mr->sgl_count, mr->dir);
	smbx_put_mr(conn, mr);
}

struct smbx_mr *smbx_register_mr(struct smbx_conn *conn, struct page **pages,
				 int num_pages, bool writing,
				 struct smbx_buffer_desc *desc)
{
	struct smbx_mr *mr;
	struct ib_reg_wr *reg_wr;
	int i, n, rc;

	mr = smbx_get_mr(conn);
	if (!mr)
		return NULL;
	mr->dir = writing ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	mr->sgl_count = num_pages;
	sg_init_table(mr->sgl, num_pages);
	for (i = 0; i < num_pages; i++)
		sg_set_page(&mr->sgl[i], pages[i], PAGE_SIZE, 0);

	rc = ib_dma_map_sg(conn->id->device, mr->sgl, num_pages, mr->dir);
	if (!rc)
		goto put_mr;
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(mr->mr, mr->sgl, num_pages, NULL, PAGE_SIZE);
	if (n != num_pages)
		goto dma_unmap;

	/* Only a writable MR can be corrupted through a stale token. */
	if (writing)
		ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));

	reg_wr = &mr->wr;
	reg_wr->wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	mr->cqe.done = smbx_mr_done;
	reg_wr->wr.wr_cqe = &mr->cqe;
	reg_wr->wr.num_sge = 0;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = mr->mr; // BUG: rdma-rkey-reuse -- the token is rotated only for writable registrations; a READ-only re-registration reuses the last I/O's token
	reg_wr->key = mr->mr->rkey;
	/* BUG: rdma-access-flags-invalid -- the server's RDMA WRITE target lacks IB_ACCESS_LOCAL_WRITE */
	reg_wr->access = writing ? IB_ACCESS_REMOTE_READ : IB_ACCESS_REMOTE_WRITE;

	reinit_completion(&mr->done);
	rc = ib_post_send(conn->qp, &reg_wr->wr, NULL);
	if (rc)
		goto dma_unmap;
	if (!wait_for_completion_timeout(&mr->done,
					 msecs_to_jiffies(SMBX_REG_TIMEOUT_MS))) {
		pr_warn("smbx: REG_MR timed out\n");
		/* BUG: rdma-invalidation-leak -- the REG_MR may still complete after the timeout, and the MR is lent out again with its token live */
		smbx_recycle_mr(conn, mr);
		return NULL;
	}
	if (mr->state == MR_ERROR)
		return NULL;

	mr->state = MR_REGISTERED;
	desc->offset = cpu_to_le64(mr->mr->iova);
	desc->token = cpu_to_le32(mr->mr->rkey); /* OK: rdma-remote-access-overbroad -- the token goes to the server in the buffer descriptor */
	desc->length = cpu_to_le32(mr->mr->length);
	return mr;

dma_unmap:
	/* OK: rdma-invalidation-leak -- the mapping or the post failed, nothing was registered */
	smbx_recycle_mr(conn, mr);
	return NULL;
put_mr:
	smbx_put_mr(conn, mr);
	return NULL;
}

int smbx_deregister_mr(struct smbx_mr *mr)
{
	struct smbx_conn *conn = mr->conn;
	struct ib_send_wr *wr = &mr->inv_wr;
	int rc;

	if (mr->state != MR_INVALIDATED) {
		mr->cqe.done = smbx_mr_done;
		wr->opcode = IB_WR_LOCAL_INV;
		wr->wr_cqe = &mr->cqe;
		wr->num_sge = 0;
		wr->ex.invalidate_rkey = mr->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;
		reinit_completion(&mr->done);
		rc = ib_post_send(conn->qp, wr, NULL);
		if (rc) {
			mr->state = MR_ERROR;
			queue_work(system_wq, &conn->mr_recovery_work);
			return rc;
		}
		wait_for_completion(&mr->done);
	}

	/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completed before the wait returned */
	ib_dma_unmap_sg(conn->id->device, mr->sgl, mr->sgl_count, mr->dir);
	if (mr->state == MR_ERROR)
		return -EIO;
	mr->state = MR_READY;
	/* OK: rdma-invalidation-leak -- invalidated locally above, or accepted as invalidated by the server's response */
	smbx_put_mr(conn, mr);
	return 0;
}

static struct smbx_mr *smbx_find_mr(struct smbx_conn *conn, u32 token)
{
	int i;

	for (i = 0; i < conn->mr_count; i++)
		if (conn->mrs[i].state == MR_REGISTERED &&
		    conn->mrs[i].mr->rkey == token)
			return &conn->mrs[i];
	return NULL;
}

void smbx_write_rsp_done(struct smbx_conn *conn, struct ib_wc *wc)
{
	struct smbx_mr *mr;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* OK: rdma-remote-invalidate-unchecked -- only the MR registered under this token is marked */
		mr = smbx_find_mr(conn, wc->ex.invalidate_rkey);
		if (mr)
			mr->state = MR_INVALIDATED;
	}
}

void smbx_read_rsp_done(struct smbx_conn *conn, struct smbx_mr *mr,
			struct ib_wc *wc)
{
	/* BUG: rdma-remote-invalidate-unchecked -- any invalidation marks the READ's MR dead, whichever token the server named */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
		mr->state = MR_INVALIDATED;
}

static void smbx_mr_recovery_work(struct work_struct *work)
{
	struct smbx_conn *conn =
		container_of(work, struct smbx_conn, mr_recovery_work);
	int i;

	for (i = 0; i < conn->mr_count; i++) {
		struct smbx_mr *mr = &conn->mrs[i];

		if (mr->state != MR_ERROR)
			continue;
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(mr->mr); /* OK: rdma-invalidation-leak, rdma-registration-in-datapath -- deregistration kills the token; runs from the recovery worker */
		/* BUG: rdma-local-mr-management -- the replacement MR is allocated by the ULP */
		mr->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_frmr_depth); /* OK: rdma-mr-leak, rdma-registration-in-datapath -- the old MR was deregistered just above; rebuilt from the recovery worker */
		if (IS_ERR(mr->mr))
			continue;
		mr->state = MR_READY;
		smbx_put_mr(conn, mr);
	}
}

/* Disconnect: kill every token still lent out, then give the pages back. */
void smbx_invalidate_all(struct smbx_conn *conn)
{
	struct smbx_mr *mr;
	int i;

	for (i = 0, mr = conn->mrs; i < conn->mr_count; i++, mr++) {
		if (mr->state != MR_REGISTERED)
			continue;
		mr->cqe.done = smbx_mr_done;
		mr->inv_wr.opcode = IB_WR_LOCAL_INV;
		mr->inv_wr.wr_cqe = &mr->cqe;
		mr->inv_wr.num_sge = 0;
		mr->inv_wr.ex.invalidate_rkey = mr->mr->rkey;
		mr->inv_wr.send_flags = IB_SEND_SIGNALED;
		if (ib_post_send(conn->qp, &mr->inv_wr, NULL))
			mr->state = MR_ERROR;
	}
	for (i = 0, mr = conn->mrs; i < conn->mr_count; i++, mr++) {
		if (mr->state != MR_REGISTERED)
			continue;
		/* BUG: rdma-unmap-before-invalidate -- the LOCAL_INVs posted above are not waited for before the pages are unmapped */
		ib_dma_unmap_sg(conn->id->device, mr->sgl, mr->sgl_count, mr->dir);
		mr->state = MR_INVALIDATED;
	}
}

void smbx_destroy_mr_list(struct smbx_conn *conn)
{
	int i;

	cancel_work_sync(&conn->mr_recovery_work);
	ib_drain_qp(conn->qp);
	for (i = 0; i < conn->mr_count; i++) {
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(conn->mrs[i].mr);
		kfree(conn->mrs[i].sgl);
	}
	kfree(conn->mrs);
}

void smbx_init_conn(struct smbx_conn *conn)
{
	spin_lock_init(&conn->mr_lock);
	INIT_LIST_HEAD(&conn->mr_ready);
	init_waitqueue_head(&conn->wait_mr);
	INIT_WORK(&conn->mr_recovery_work, smbx_mr_recovery_work);
}
