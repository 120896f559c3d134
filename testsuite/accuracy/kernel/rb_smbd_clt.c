// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * rb_smbd_clt.c - SMB Direct (MS-SMBD) client: memory registration for SMB2
 * READ/WRITE with an RDMA channel, buffer descriptors and remote
 * invalidation.
 *
 * The connection owns a list of MRs allocated at negotiate time; an MR is
 * handed out by flipping its state from MR_READY to MR_REGISTERED.  For an
 * RDMA-channel request the pages are mapped and fast-registered (signaled
 * REG_MR) and described to the server by an smbd_buffer_descriptor_v1
 * (offset, token = rkey, length).  With SMB2_CHANNEL_RDMA_V1_INVALIDATE the
 * server ends the transfer with SEND_WITH_INV of that token; the response
 * path clears need_invalidate only when the token matches.  smbd_deregister_mr()
 * posts a signaled LOCAL_INV for the others and waits for it before the pages
 * are unmapped.  MRs in MR_ERROR are deregistered and reallocated by the
 * recovery worker.
 *
 * Known problems: the READ response path accepts any remote invalidation,
 * a LOCAL_INV that times out is treated as done, a cancelled request hands
 * its MR back without invalidating, and MR list setup leaks an MR when the
 * scatterlist allocation fails.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-rkey-reuse,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad -- not reviewed in this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SMBD_MAX_SLOTS		64
#define SMBD_INV_TIMEOUT_MS	5000

#define log_rdma_mr(fmt, ...)	pr_err("smbd: mr: " fmt, ##__VA_ARGS__)

enum smbd_mr_state { MR_READY, MR_REGISTERED, MR_INVALIDATED, MR_ERROR };

struct smbd_buffer_descriptor_v1 {
	__le64	offset;
	__le32	token;
	__le32	length;
};

struct smbd_conn;

struct smbd_mr {
	struct smbd_conn	*conn;
	struct list_head	list;
	enum smbd_mr_state	state;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	bool			need_invalidate;
	union {
		struct ib_reg_wr	wr;
		struct ib_send_wr	inv_wr;
	};
	struct ib_cqe		cqe;
	struct completion	invalidate_done;
};

struct smbd_slot {
	u64			mid;
	bool			active;
	bool			is_read;
	struct smbd_mr		*mr;
	int			status;
	struct completion	done;
};

struct smbd_conn {
	struct rdma_cm_id	*id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	spinlock_t		mr_list_lock;
	struct list_head	mr_list;
	int			mr_count;
	int			max_frmr_depth;
	atomic_t		mr_ready_count;
	atomic_t		mr_used_count;
	wait_queue_head_t	wait_mr;
	wait_queue_head_t	wait_for_mr_cleanup;
	struct workqueue_struct	*workqueue;
	struct work_struct	mr_recovery_work;
	struct smbd_slot	slots[SMBD_MAX_SLOTS];
	bool			disconnected;
};

void smbd_disconnect_rdma_connection(struct smbd_conn *conn);

/* -------------------------------------------------------------- MR list */

static void destroy_mrs_list(struct smbd_conn *conn)
{
	struct smbd_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &conn->mr_list, list) {
		list_del(&mr->list);
		ib_dereg_mr(mr->mr);
		if (mr->state == MR_INVALIDATED || mr->state == MR_REGISTERED)
			ib_dma_unmap_sg(conn->dev, mr->sgl, mr->sgl_count, mr->dir);
		kfree(mr->sgl);
		kfree(mr);
	}
}

static int allocate_mrs_list(struct smbd_conn *conn)
{
	struct smbd_mr *smbdirect_mr;
	int i;

	for (i = 0; i < conn->mr_count; i++) {
		smbdirect_mr = kzalloc(sizeof(*smbdirect_mr), GFP_KERNEL);
		if (!smbdirect_mr)
			goto out;
		smbdirect_mr->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
					       conn->max_frmr_depth);
		if (IS_ERR(smbdirect_mr->mr)) {
			log_rdma_mr("ib_alloc_mr failed\n");
			kfree(smbdirect_mr); /* OK: rdma-mr-leak -- the allocation failed, nothing is held */
			goto out;
		}
		smbdirect_mr->sgl = kcalloc(conn->max_frmr_depth,
					    sizeof(struct scatterlist), GFP_KERNEL);
		if (!smbdirect_mr->sgl) {
			log_rdma_mr("failed to allocate sgl\n");
			kfree(smbdirect_mr); /* BUG: rdma-mr-leak -- smbdirect_mr->mr is freed with its holder, never deregistered */
			goto out;
		}
		smbdirect_mr->state = MR_READY;
		smbdirect_mr->conn = conn;
		init_completion(&smbdirect_mr->invalidate_done);
		list_add_tail(&smbdirect_mr->list, &conn->mr_list);
		atomic_inc(&conn->mr_ready_count);
	}
	return 0;

out:
	destroy_mrs_list(conn);
	return -ENOMEM;
}

static struct smbd_mr *get_mr(struct smbd_conn *conn)
{
	struct smbd_mr *ret;
	long rc;
again:
	rc = wait_event_interruptible(conn->wait_mr,
				      atomic_read(&conn->mr_ready_count) ||
				      conn->disconnected);
	if (rc || conn->disconnected)
		return NULL;

	spin_lock(&conn->mr_list_lock);
	list_for_each_entry(ret, &conn->mr_list, list) {
		if (ret->state == MR_READY) {
			ret->state = MR_REGISTERED;
			spin_unlock(&conn->mr_list_lock);
			atomic_dec(&conn->mr_ready_count);
			atomic_inc(&conn->mr_used_count);
			return ret;
		}
	}
	spin_unlock(&conn->mr_list_lock);
	goto again;
}

/* Unmap the pages and make the MR available to get_mr() again. */
static void smbd_mr_unmap_ready(struct smbd_conn *conn, struct smbd_mr *mr)
{
	ib_dma_unmap_sg(conn->dev, mr->sgl, mr->sgl_count, mr->dir);
	mr->state = MR_READY;
	atomic_inc(&conn->mr_ready_count);
	wake_up(&conn->wait_mr);
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_for_mr_cleanup);
}

/* ------------------------------------------------- register/deregister */

static void register_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	if (wc->status) {
		log_rdma_mr("REG_MR failed status=%x\n", wc->status);
		mr->state = MR_ERROR;
		smbd_disconnect_rdma_connection(mr->conn);
	}
}

static void local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	mr->state = MR_INVALIDATED;
	if (wc->status != IB_WC_SUCCESS) {
		log_rdma_mr("invalidate failed status=%x\n", wc->status);
		mr->state = MR_ERROR;
	}
	complete(&mr->invalidate_done);
}

struct smbd_mr *smbd_register_mr(struct smbd_conn *conn, struct page *pages[],
				 int num_pages, int offset, int tailsz,
				 bool writing, struct smbd_buffer_descriptor_v1 *desc)
{
	struct smbd_mr *smbdirect_mr;
	struct ib_reg_wr *reg_wr;
	int rc, i;

	if (num_pages > conn->max_frmr_depth)
		return NULL;
	smbdirect_mr = get_mr(conn);
	if (!smbdirect_mr)
		return NULL;

	smbdirect_mr->need_invalidate = true;
	smbdirect_mr->sgl_count = num_pages;
	smbdirect_mr->dir = writing ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	sg_init_table(smbdirect_mr->sgl, num_pages);
	for (i = 0; i < num_pages; i++)
		sg_set_page(&smbdirect_mr->sgl[i], pages[i],
			    i == num_pages - 1 ? tailsz : PAGE_SIZE,
			    i == 0 ? offset : 0);

	rc = ib_dma_map_sg(conn->dev, smbdirect_mr->sgl, num_pages,
			   smbdirect_mr->dir);
	if (!rc)
		goto dma_map_error;
	rc = ib_map_mr_sg(smbdirect_mr->mr, smbdirect_mr->sgl, num_pages,
			  NULL, PAGE_SIZE);
	if (rc != num_pages)
		goto map_mr_error;

	ib_update_fast_reg_key(smbdirect_mr->mr, ib_inc_rkey(smbdirect_mr->mr->rkey));
	reg_wr = &smbdirect_mr->wr;
	memset(reg_wr, 0, sizeof(*reg_wr));
	reg_wr->wr.opcode = IB_WR_REG_MR;
	smbdirect_mr->cqe.done = register_mr_done;
	reg_wr->wr.wr_cqe = &smbdirect_mr->cqe;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = smbdirect_mr->mr;
	reg_wr->key = smbdirect_mr->mr->rkey;
	/* the server writes into READ buffers and reads from WRITE buffers */
	reg_wr->access = writing ? IB_ACCESS_REMOTE_READ :
				   IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE;

	rc = ib_post_send(conn->qp, &reg_wr->wr, NULL);
	if (!rc) {
		desc->offset = cpu_to_le64(smbdirect_mr->mr->iova);
		desc->token = cpu_to_le32(smbdirect_mr->mr->rkey);
		desc->length = cpu_to_le32((u32)smbdirect_mr->mr->length);
		return smbdirect_mr;
	}
	log_rdma_mr("ib_post_send failed rc=%x key=%x\n", rc, reg_wr->key);

map_mr_error:
	ib_dma_unmap_sg(conn->dev, smbdirect_mr->sgl, num_pages,
			smbdirect_mr->dir); /* OK: rdma-invalidation-leak -- the REG_MR post failed or was never built; no token went out */
dma_map_error:
	smbdirect_mr->state = MR_ERROR;
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_for_mr_cleanup);
	queue_work(conn->workqueue, &conn->mr_recovery_work);
	return NULL;
}

int smbd_deregister_mr(struct smbd_mr *smbdirect_mr)
{
	struct smbd_conn *conn = smbdirect_mr->conn;
	struct ib_send_wr *wr;
	int rc = 0;

	if (smbdirect_mr->need_invalidate) {
		wr = &smbdirect_mr->inv_wr;
		memset(wr, 0, sizeof(*wr));
		wr->opcode = IB_WR_LOCAL_INV;
		smbdirect_mr->cqe.done = local_inv_done;
		wr->wr_cqe = &smbdirect_mr->cqe;
		wr->num_sge = 0;
		wr->ex.invalidate_rkey = smbdirect_mr->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;

		init_completion(&smbdirect_mr->invalidate_done);
		rc = ib_post_send(conn->qp, wr, NULL);
		if (rc) {
			log_rdma_mr("ib_post_send failed rc=%x\n", rc);
			smbdirect_mr->state = MR_ERROR;
			smbd_disconnect_rdma_connection(conn);
			goto done;
		}
		if (!wait_for_completion_timeout(&smbdirect_mr->invalidate_done,
				msecs_to_jiffies(SMBD_INV_TIMEOUT_MS))) {
			log_rdma_mr("LOCAL_INV timed out\n");
			smbd_disconnect_rdma_connection(conn);
			/* the disconnect flushes it anyway */
			smbdirect_mr->state = MR_INVALIDATED;
		}
		smbdirect_mr->need_invalidate = false;
	} else {
		/* the server invalidated this token (checked on receive) */
		smbdirect_mr->state = MR_INVALIDATED;
	}

	if (smbdirect_mr->state == MR_INVALIDATED) {
		/* OK: rdma-invalidation-leak -- reached after a LOCAL_INV or a matched remote invalidation */
		smbd_mr_unmap_ready(conn, smbdirect_mr); /* BUG: rdma-unmap-before-invalidate -- on the timeout path the LOCAL_INV has not completed (a flush would leave the key valid) */
		return 0;
	}
	queue_work(conn->workqueue, &conn->mr_recovery_work);
done:
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_for_mr_cleanup);
	return rc;
}

static void smbd_mr_recovery_work(struct work_struct *work)
{
	struct smbd_conn *conn = container_of(work, struct smbd_conn,
					      mr_recovery_work);
	struct smbd_mr *smbdirect_mr;

	list_for_each_entry(smbdirect_mr, &conn->mr_list, list) {
		if (smbdirect_mr->state != MR_ERROR)
			continue;

		ib_dereg_mr(smbdirect_mr->mr);
		if (smbdirect_mr->sgl_count)
			ib_dma_unmap_sg(conn->dev, smbdirect_mr->sgl,
					smbdirect_mr->sgl_count, smbdirect_mr->dir); /* OK: rdma-invalidation-leak -- deregistered first */
		smbdirect_mr->sgl_count = 0;

		smbdirect_mr->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
					       conn->max_frmr_depth); /* OK: rdma-mr-leak -- the old MR was deregistered above */
		if (IS_ERR(smbdirect_mr->mr)) {
			log_rdma_mr("ib_alloc_mr failed\n");
			smbd_disconnect_rdma_connection(conn);
			return;
		}
		smbdirect_mr->state = MR_READY;
		atomic_inc(&conn->mr_ready_count);
		wake_up(&conn->wait_mr);
	}
}

/* ------------------------------------------------------------ responses */

static void smbd_complete_write_rsp(struct smbd_conn *conn,
				    struct smbd_slot *slot, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) { /* OK: rdma-remote-invalidate-unchecked -- the token is compared with the request's MR */
		if (slot->mr && wc->ex.invalidate_rkey == slot->mr->mr->rkey)
			slot->mr->need_invalidate = false;
		else
			log_rdma_mr("server invalidated unexpected token %#x\n",
				    wc->ex.invalidate_rkey);
	}
	slot->status = 0;
	complete(&slot->done);
}

static void smbd_complete_read_rsp(struct smbd_conn *conn,
				   struct smbd_slot *slot, struct ib_wc *wc)
{
	/* the payload was placed by the server's RDMA WRITE */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) /* BUG: rdma-remote-invalidate-unchecked -- any invalidated token clears need_invalidate for this request's MR */
		slot->mr->need_invalidate = false;
	slot->status = 0;
	complete(&slot->done);
}

bool smbd_process_negotiate_resp(struct smbd_conn *conn, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) { /* OK: rdma-remote-invalidate-unchecked -- no token exists before negotiation; the response is rejected */
		pr_err("smbd: negotiate response with invalidate, rejecting\n");
		return false;
	}
	return wc->byte_len >= 32;
}

void smbd_recv_data(struct smbd_conn *conn, struct ib_wc *wc, u64 mid)
{
	unsigned int i;

	for (i = 0; i < SMBD_MAX_SLOTS; i++) {
		struct smbd_slot *slot = &conn->slots[i];

		if (!slot->active || slot->mid != mid)
			continue;
		if (slot->is_read)
			smbd_complete_read_rsp(conn, slot, wc);
		else
			smbd_complete_write_rsp(conn, slot, wc);
		return;
	}
}

/* The caller gave up on the request (signal or SMB2 timeout). */
void smbd_cancel_request(struct smbd_conn *conn, struct smbd_slot *slot)
{
	struct smbd_mr *mr = slot->mr;

	slot->active = false;
	slot->mr = NULL;
	if (mr)
		smbd_mr_unmap_ready(conn, mr); /* BUG: rdma-invalidation-leak -- the server still holds the token and may write into pages handed back to the caller */
}

/* ---------------------------------------------------------------- setup */

int smbd_create_qp(struct smbd_conn *conn, int send_credits, int recv_credits)
{
	struct ib_qp_init_attr qp_attr;
	int rc;

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = conn;
	qp_attr.send_cq = conn->cq;
	qp_attr.recv_cq = conn->cq;
	qp_attr.cap.max_send_wr = send_credits + 2 * conn->mr_count;
	qp_attr.cap.max_recv_wr = recv_credits;
	qp_attr.cap.max_send_sge = 2;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every SMBD send, REG_MR and LOCAL_INV is posted signaled */
	qp_attr.qp_type = IB_QPT_RC;

	rc = rdma_create_qp(conn->id, conn->pd, &qp_attr);
	if (rc)
		return rc;
	conn->qp = conn->id->qp;

	spin_lock_init(&conn->mr_list_lock);
	INIT_LIST_HEAD(&conn->mr_list);
	init_waitqueue_head(&conn->wait_mr);
	init_waitqueue_head(&conn->wait_for_mr_cleanup);
	INIT_WORK(&conn->mr_recovery_work, smbd_mr_recovery_work);
	rc = allocate_mrs_list(conn);
	if (rc)
		rdma_destroy_qp(conn->id);
	return rc;
}

int smbd_post_send(struct smbd_conn *conn, struct ib_cqe *cqe,
		   struct ib_sge *sge, int num_sge)
{
	struct ib_send_wr send_wr;

	memset(&send_wr, 0, sizeof(send_wr));
	send_wr.wr_cqe = cqe;
	send_wr.sg_list = sge;
	send_wr.num_sge = num_sge;
	send_wr.opcode = IB_WR_SEND;
	send_wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(conn->qp, &send_wr, NULL);
}

MODULE_DESCRIPTION("SMB Direct client memory registration");
MODULE_LICENSE("GPL");
