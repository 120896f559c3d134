// SPDX-License-Identifier: GPL-2.0
/*
 * smbc: memory registration of an SMB-Direct-style client (modelled on the
 * MR handling of fs/smb/client/smbdirect.c, written fresh).
 *
 * The client keeps a list of MRs sized from the server's responder
 * resources. For an SMB2 READ or WRITE with an RDMA channel it takes a ready
 * MR, rotates its key, posts a signaled REG_MR and sends the buffer
 * descriptor. When the I/O is done, smbc_deregister_mr() either posts a
 * signaled LOCAL_INV and waits for it before unmapping, or, for dialects
 * where the server invalidates with SEND_WITH_INV, assumes the server did.
 *
 * The bug is that assumption: nothing looks at the receive completion's
 * IB_WC_WITH_INVALIDATE flag or invalidated rkey, so on the remote path the
 * pages are unmapped and the MR made ready again while a server that did not
 * (or could not) invalidate still holds a working key. Allocation, rotation,
 * flags and the LOCAL_INV path are right.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/wait.h>
#include <rdma/ib_verbs.h>

enum smbc_mr_state {
	MR_READY,
	MR_REGISTERED,
	MR_INVALIDATED,
	MR_ERROR
};

struct smbc_conn;

struct smbc_mr {
	struct smbc_conn	*conn;
	enum smbc_mr_state	state;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	union {
		struct ib_reg_wr	wr;
		struct ib_send_wr	inv_wr;
	};
	struct ib_cqe		cqe;
	bool			need_invalidate;
	struct completion	invalidate_done;
	struct list_head	list;
};

struct smbc_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct list_head	mr_list;
	atomic_t		mr_ready_count;
	atomic_t		mr_used_count;
	wait_queue_head_t	wait_mr;
	wait_queue_head_t	wait_for_mr_cleanup;
	struct work_struct	mr_recovery_work;
	int			responder_resources;
	u32			max_frmr_depth;
	enum ib_mr_type		mr_type;
};

void smbc_disconnect(struct smbc_conn *conn);
struct smbc_mr *smbc_get_ready_mr(struct smbc_conn *conn);

static void smbc_destroy_mr_list(struct smbc_conn *conn)
{
	struct smbc_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &conn->mr_list, list) {
		list_del(&mr->list);
		/* BUG: rdma-local-mr-management -- the client deregisters its own MRs */
		ib_dereg_mr(mr->mr); /* OK: rdma-invalidation-leak -- deregistration kills any key still valid */
		kfree(mr->sgl);
		kfree(mr);
	}
}

int smbc_allocate_mr_list(struct smbc_conn *conn)
{
	struct smbc_mr *mr;
	int i;

	INIT_LIST_HEAD(&conn->mr_list);
	init_waitqueue_head(&conn->wait_mr);
	init_waitqueue_head(&conn->wait_for_mr_cleanup);
	atomic_set(&conn->mr_ready_count, 0);
	atomic_set(&conn->mr_used_count, 0);

	for (i = 0; i < conn->responder_resources * 2; i++) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			goto out;
		/* BUG: rdma-local-mr-management -- the client allocates its own MRs */
		mr->mr = ib_alloc_mr(conn->pd, conn->mr_type, conn->max_frmr_depth);
		if (IS_ERR(mr->mr)) {
			kfree(mr);
			goto out;
		}
		mr->sgl = kcalloc(conn->max_frmr_depth, sizeof(*mr->sgl),
				  GFP_KERNEL);
		if (!mr->sgl) {
			/* BUG: rdma-local-mr-management -- the client deregisters its MR */
			ib_dereg_mr(mr->mr); /* OK: rdma-mr-leak -- the MR of the failing iteration is released before unwinding the rest */
			kfree(mr);
			goto out;
		}
		mr->state = MR_READY;
		mr->conn = conn;
		list_add_tail(&mr->list, &conn->mr_list);
		atomic_inc(&conn->mr_ready_count);
	}
	return 0;

out:
	smbc_destroy_mr_list(conn);
	return -ENOMEM;
}

static void smbc_register_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbc_mr *mr = container_of(wc->wr_cqe, struct smbc_mr, cqe);

	if (wc->status) {
		pr_err("smbc: registration failed: %s\n",
		       ib_wc_status_msg(wc->status));
		mr->state = MR_ERROR;
		smbc_disconnect(mr->conn);
	}
}

struct smbc_mr *smbc_register_mr(struct smbc_conn *conn, int num_pages,
				 bool writing, bool need_invalidate)
{
	struct smbc_mr *mr;
	struct ib_reg_wr *reg_wr;
	int rc, n;

	mr = smbc_get_ready_mr(conn);
	if (!mr)
		return NULL;

	mr->need_invalidate = need_invalidate;
	mr->sgl_count = num_pages;
	mr->dir = writing ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	rc = ib_dma_map_sg(conn->ibdev, mr->sgl, mr->sgl_count, mr->dir);
	if (!rc)
		goto dma_map_error;

	/* BUG: rdma-local-mr-management -- the client maps pages into its MR */
	n = ib_map_mr_sg(mr->mr, mr->sgl, mr->sgl_count, NULL, SZ_4K);
	if (n != mr->sgl_count)
		goto map_mr_error;

	ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));
	reg_wr = &mr->wr;
	reg_wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the client */
	mr->cqe.done = smbc_register_mr_done;
	reg_wr->wr.wr_cqe = &mr->cqe;
	reg_wr->wr.num_sge = 0;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = mr->mr; /* OK: rdma-rkey-reuse -- the key was rotated just above */
	reg_wr->key = mr->mr->rkey;
	/* OK: rdma-access-flags-invalid -- the write branch carries LOCAL_WRITE, the read branch grants only REMOTE_READ */
	reg_wr->access = writing ?
		IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
		IB_ACCESS_REMOTE_READ;

	mr->state = MR_REGISTERED;
	rc = ib_post_send(conn->qp, &reg_wr->wr, NULL);
	if (!rc)
		return mr;

	pr_err("smbc: ib_post_send failed rc=%x reg_wr->key=%x\n",
	       rc, reg_wr->key);
map_mr_error:
	ib_dma_unmap_sg(conn->ibdev, mr->sgl, mr->sgl_count, mr->dir);
dma_map_error:
	mr->state = MR_ERROR;
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_for_mr_cleanup);
	smbc_disconnect(conn);
	return NULL;
}


static void smbc_local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbc_mr *mr = container_of(wc->wr_cqe, struct smbc_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		mr->state = MR_ERROR;
		pr_err("smbc: invalidate failed status=%x\n", wc->status);
	}
	complete(&mr->invalidate_done);
}

int smbc_deregister_mr(struct smbc_mr *mr)
{
	struct smbc_conn *conn = mr->conn;
	struct ib_send_wr *wr;
	int rc = 0;

	if (mr->need_invalidate) {
		wr = &mr->inv_wr;
		wr->opcode = IB_WR_LOCAL_INV;
		mr->cqe.done = smbc_local_inv_done;
		wr->wr_cqe = &mr->cqe;
		wr->num_sge = 0;
		wr->ex.invalidate_rkey = mr->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;

		init_completion(&mr->invalidate_done);
		rc = ib_post_send(conn->qp, wr, NULL);
		if (rc) {
			pr_err("smbc: ib_post_send failed rc=%x\n", rc);
			smbc_disconnect(conn);
			goto done;
		}
		wait_for_completion(&mr->invalidate_done);
		mr->need_invalidate = false;
	} else {
		/* the server invalidated it with SEND_WITH_INV */
		mr->state = MR_INVALIDATED;
	}

	if (mr->state == MR_INVALIDATED || mr->state == MR_REGISTERED) {
		/* BUG: rdma-invalidation-leak -- on the remote-invalidation path nothing checked that the server's SEND_WITH_INV named this key (or came at all) */
		ib_dma_unmap_sg(conn->ibdev, mr->sgl, mr->sgl_count, mr->dir); /* OK: rdma-unmap-before-invalidate -- on the local path the signaled LOCAL_INV was waited for */
		mr->state = MR_READY;
		if (atomic_inc_return(&conn->mr_ready_count) == 1)
			wake_up(&conn->wait_mr);
	} else {
		queue_work(system_wq, &conn->mr_recovery_work);
	}
done:
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_for_mr_cleanup);
	return rc;
}

void smbc_mr_recovery_work(struct work_struct *work)
{
	struct smbc_conn *conn =
		container_of(work, struct smbc_conn, mr_recovery_work);
	struct smbc_mr *mr;

	list_for_each_entry(mr, &conn->mr_list, list) {
		if (mr->state != MR_ERROR)
			continue;
		/* BUG: rdma-local-mr-management -- the client deregisters its MR */
		ib_dereg_mr(mr->mr); /* OK: rdma-registration-in-datapath -- recovery work after an MR failed, not the I/O path */
		/* BUG: rdma-local-mr-management -- the client allocates a replacement MR */
		mr->mr = ib_alloc_mr(conn->pd, conn->mr_type, conn->max_frmr_depth);
		if (IS_ERR(mr->mr)) {
			smbc_disconnect(conn);
			return;
		}
		mr->state = MR_READY;
		if (atomic_inc_return(&conn->mr_ready_count) == 1)
			wake_up(&conn->wait_mr);
	}
}
