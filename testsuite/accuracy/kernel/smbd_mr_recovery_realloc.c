// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * smbdx: memory registration for the RDMA read/write channel of an SMB
 * Direct client, in the shape of fs/cifs/smbdirect.c as first merged
 * ("CIFS: SMBD: Implement RDMA memory registration", Long Li, 2017) and
 * before "CIFS: SMBD: Do not call ib_dereg_mr on invalidated memory
 * registration" (Long Li, 2018). Written fresh for the held-out batch.
 *
 * The client keeps a list of MRs allocated at connection setup. For an
 * SMB2 READ/WRITE it takes a ready MR, fast-registers the pages with a new
 * key (ib_inc_rkey) and sends the key to the server in a buffer
 * descriptor. When the I/O is done, smbdx_deregister_mr() posts a
 * signaled LOCAL_INV and waits for it before the pages are unmapped.
 *
 * The defect is the recovery: every invalidated MR is deregistered and a
 * fresh one allocated (ib_dereg_mr + ib_alloc_mr are device commands) once
 * per I/O, from the I/O completion path. The upstream fix keeps invalidated
 * MRs and only recycles MRs whose registration failed. Here the recovery
 * runs inline from smbdx_deregister_mr() (upstream it ran from
 * smbd_mr_recovery_work, scheduled by the same function for each I/O).
 * smbdx_mr_recovery_work() below is the kept, error-only recovery.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/completion.h>
#include <linux/wait.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

enum smbdx_mr_state {
	MR_READY,
	MR_REGISTERED,
	MR_INVALIDATED,
	MR_ERROR,
};

struct smbdx_connection {
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	enum ib_mr_type		mr_type;
	int			max_frmr_depth;
	int			responder_resources;
	struct list_head	mr_list;
	spinlock_t		mr_list_lock;
	atomic_t		mr_ready_count;
	atomic_t		mr_used_count;
	wait_queue_head_t	wait_mr;
	struct work_struct	mr_recovery_work;
	struct work_struct	disconnect_work;
};

struct smbdx_mr {
	struct smbdx_connection	*conn;
	struct list_head	list;
	enum smbdx_mr_state	state;
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
};

static void smbdx_disconnect(struct smbdx_connection *conn)
{
	schedule_work(&conn->disconnect_work);
}

static void smbdx_register_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbdx_mr *mr = container_of(wc->wr_cqe, struct smbdx_mr, cqe);

	if (wc->status) {
		pr_err("status=%d\n", wc->status);
		mr->state = MR_ERROR;
		smbdx_disconnect(mr->conn);
	}
}

static void smbdx_local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbdx_mr *mr = container_of(wc->wr_cqe, struct smbdx_mr, cqe);

	mr->state = MR_INVALIDATED;
	if (wc->status != IB_WC_SUCCESS) {
		pr_err("invalidate failed status=%x\n", wc->status);
		mr->state = MR_ERROR;
	}
	complete(&mr->invalidate_done);
}

/**
 * smbdx_allocate_mr_list - allocate the connection's MRs at setup time
 * @conn: the connection
 */
int smbdx_allocate_mr_list(struct smbdx_connection *conn)
{
	struct smbdx_mr *mr, *tmp;
	int i;

	INIT_LIST_HEAD(&conn->mr_list);
	init_waitqueue_head(&conn->wait_mr);

	for (i = 0; i < conn->responder_resources * 2; i++) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			goto out;
		/* BUG: rdma-local-mr-management -- the ULP allocates its own MR list */
		mr->mr = ib_alloc_mr(conn->pd, conn->mr_type,
				     conn->max_frmr_depth); /* OK: rdma-registration-in-datapath -- the list is allocated once, at connection setup */
		if (IS_ERR(mr->mr)) {
			kfree(mr);
			goto out;
		}
		mr->sgl = kcalloc(conn->max_frmr_depth,
				  sizeof(struct scatterlist), GFP_KERNEL);
		if (!mr->sgl) {
			ib_dereg_mr(mr->mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
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
	list_for_each_entry_safe(mr, tmp, &conn->mr_list, list) {
		list_del(&mr->list);
		ib_dereg_mr(mr->mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		kfree(mr->sgl);
		kfree(mr);
	}
	return -ENOMEM;
}

static struct smbdx_mr *smbdx_get_mr(struct smbdx_connection *conn)
{
	struct smbdx_mr *ret = NULL, *mr;

	spin_lock(&conn->mr_list_lock);
	list_for_each_entry(mr, &conn->mr_list, list) {
		if (mr->state == MR_READY) {
			mr->state = MR_REGISTERED;
			ret = mr;
			break;
		}
	}
	spin_unlock(&conn->mr_list_lock);
	if (ret) {
		atomic_dec(&conn->mr_ready_count);
		atomic_inc(&conn->mr_used_count);
	}
	return ret;
}

/**
 * smbdx_register_mr - register pages for the server's RDMA read or write
 * @conn: the connection
 * @sgl: pages of the I/O, already filled in
 * @num_pages: entries in @sgl
 * @writing: true when the server will RDMA READ from the pages
 *
 * Returns the MR, whose rkey goes into the SMB2 buffer descriptor, or NULL.
 */
struct smbdx_mr *smbdx_register_mr(struct smbdx_connection *conn,
				   struct scatterlist *sgl, int num_pages,
				   bool writing)
{
	struct smbdx_mr *mr;
	struct ib_reg_wr *reg_wr;
	int rc, n;

	mr = smbdx_get_mr(conn);
	if (!mr)
		return NULL;

	mr->need_invalidate = true;
	mr->sgl = sgl;
	mr->sgl_count = num_pages;
	mr->dir = writing ? DMA_TO_DEVICE : DMA_FROM_DEVICE;

	rc = ib_dma_map_sg(conn->id->device, mr->sgl, num_pages, mr->dir);
	if (!rc) {
		pr_err("ib_dma_map_sg num_pages=%x rc=%x\n", num_pages, rc);
		goto dma_map_error;
	}

	/* BUG: rdma-local-mr-management -- the ULP maps the pages into its MR itself */
	n = ib_map_mr_sg(mr->mr, mr->sgl, num_pages, NULL, PAGE_SIZE);
	if (n != num_pages) {
		pr_err("ib_map_mr_sg failed rc = %d num_pages = %x\n",
		       n, num_pages);
		goto map_mr_error;
	}

	ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));
	reg_wr = &mr->wr;
	reg_wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	mr->cqe.done = smbdx_register_mr_done;
	reg_wr->wr.wr_cqe = &mr->cqe;
	reg_wr->wr.num_sge = 0;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = mr->mr; /* OK: rdma-rkey-reuse -- the key byte was advanced with ib_inc_rkey() just above */
	reg_wr->key = mr->mr->rkey;
	reg_wr->access = writing ?
			IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			IB_ACCESS_REMOTE_READ;

	/*
	 * There is no need for waiting for completion on ib_post_send on
	 * IB_WR_REG_MR. Hardware enforces a barrier and order of execution
	 * on the next ib_post_send when we actually send I/O to remote peer.
	 */
	rc = ib_post_send(conn->id->qp, &reg_wr->wr, NULL);
	if (!rc)
		return mr;

	pr_err("ib_post_send failed rc=%x reg_wr->key=%x\n", rc, reg_wr->key);

map_mr_error:
	/* OK: rdma-invalidation-leak -- the REG_MR was never posted, so no key was handed out */
	ib_dma_unmap_sg(conn->id->device, mr->sgl, mr->sgl_count, mr->dir);

dma_map_error:
	mr->state = MR_ERROR;
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_mr);
	smbdx_disconnect(conn);
	return NULL;
}

/*
 * Per-I/O recovery of an invalidated MR (the pre-fix behaviour): the MR
 * is thrown away and a new one allocated.
 */
static void smbdx_recover_invalidated_mr(struct smbdx_connection *conn,
					 struct smbdx_mr *mr)
{
	int rc;

	/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a device command per I/O: the MR was just invalidated and could be reused as it is */
	rc = ib_dereg_mr(mr->mr);
	if (rc)
		pr_err("ib_dereg_mr failed rc=%x\n", rc);

	/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a new MR is allocated for every finished I/O */
	mr->mr = ib_alloc_mr(conn->pd, conn->mr_type, conn->max_frmr_depth);
	if (IS_ERR(mr->mr)) {
		pr_err("ib_alloc_mr failed mr_type=%x max_frmr_depth=%x\n",
		       conn->mr_type, conn->max_frmr_depth);
		mr->mr = NULL;
		mr->state = MR_ERROR;
		smbdx_disconnect(conn);
		return;
	}

	mr->state = MR_READY;
	if (atomic_inc_return(&conn->mr_ready_count) == 1)
		wake_up(&conn->wait_mr);
}

/**
 * smbdx_deregister_mr - invalidate an MR after its I/O finished
 * @mr: the MR returned by smbdx_register_mr()
 */
int smbdx_deregister_mr(struct smbdx_mr *mr)
{
	struct smbdx_connection *conn = mr->conn;
	struct ib_send_wr *wr;
	int rc = 0;

	if (mr->need_invalidate) {
		wr = &mr->inv_wr;
		wr->opcode = IB_WR_LOCAL_INV;
		mr->cqe.done = smbdx_local_inv_done;
		wr->wr_cqe = &mr->cqe;
		wr->num_sge = 0;
		wr->ex.invalidate_rkey = mr->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;

		init_completion(&mr->invalidate_done);
		rc = ib_post_send(conn->id->qp, wr, NULL);
		if (rc) {
			pr_err("ib_post_send failed rc=%x\n", rc);
			smbdx_disconnect(conn);
			goto done;
		}
		wait_for_completion(&mr->invalidate_done);
		mr->need_invalidate = false;
	}

	if (mr->state == MR_INVALIDATED) {
		/* OK: rdma-unmap-before-invalidate -- the signaled LOCAL_INV completed (waited for above) */
		ib_dma_unmap_sg(conn->id->device, mr->sgl, mr->sgl_count,
				mr->dir);
		smbdx_recover_invalidated_mr(conn, mr);
	} else {
		/* a failed registration or invalidation: the worker recycles it */
		queue_work(system_wq, &conn->mr_recovery_work);
	}

done:
	if (atomic_dec_and_test(&conn->mr_used_count))
		wake_up(&conn->wait_mr);
	return rc;
}

/*
 * Recovery of MRs whose registration or invalidation failed: rare, and
 * run from a worker, not once per I/O.
 */
void smbdx_mr_recovery_work(struct work_struct *work)
{
	struct smbdx_connection *conn =
		container_of(work, struct smbdx_connection, mr_recovery_work);
	struct smbdx_mr *mr;

	list_for_each_entry(mr, &conn->mr_list, list) {
		if (mr->state != MR_ERROR)
			continue;

		ib_dereg_mr(mr->mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		/* BUG: rdma-local-mr-management -- the ULP allocates its own MRs */
		mr->mr = ib_alloc_mr(conn->pd, conn->mr_type,
				     conn->max_frmr_depth); /* OK: rdma-registration-in-datapath -- only MRs left in MR_ERROR are replaced, from the recovery worker */
		if (IS_ERR(mr->mr)) {
			mr->mr = NULL;
			smbdx_disconnect(conn);
			return;
		}
		mr->state = MR_READY;
		if (atomic_inc_return(&conn->mr_ready_count) == 1)
			wake_up(&conn->wait_mr);
	}
}
