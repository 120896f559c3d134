// SPDX-License-Identifier: GPL-2.0
/*
 * sdx smbd_mr.c: the MR list and per-I/O registration (see smbdx.h).
 *
 * Two bugs in sdx_register_mr(): the MRs of the list are registered again
 * and again without a new key, and a buffer the server will write (an SMB2
 * READ) is registered with REMOTE_WRITE but no LOCAL_WRITE, so that REG_MR
 * completes in error. Deregistration posts a signaled LOCAL_INV and waits
 * for it before unmapping, and the list is unwound correctly.
 */
#include "smbdx.h"

void sdx_destroy_mr_list(struct sdx_conn *conn)
{
	struct sdx_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &conn->mr_list, list) {
		list_del(&mr->list);
		/* BUG: rdma-local-mr-management -- the client deregisters its own MRs */
		ib_dereg_mr(mr->mr); /* OK: rdma-invalidation-leak -- deregistration kills the key */
		kfree(mr->sgl);
		kfree(mr);
	}
}

int sdx_allocate_mr_list(struct sdx_conn *conn)
{
	struct sdx_mr *mr;
	int i;

	INIT_LIST_HEAD(&conn->mr_list);
	for (i = 0; i < conn->responder_resources * 2; i++) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			goto out;
		/* BUG: rdma-local-mr-management -- the client allocates its own MRs */
		mr->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
				     conn->max_frmr_depth); /* OK: rdma-registration-in-datapath -- at connection setup */
		if (IS_ERR(mr->mr)) {
			kfree(mr);
			goto out;
		}
		mr->sgl = kcalloc(conn->max_frmr_depth, sizeof(*mr->sgl),
				  GFP_KERNEL);
		if (!mr->sgl) {
			/* BUG: rdma-local-mr-management -- the client deregisters its MR */
			ib_dereg_mr(mr->mr); /* OK: rdma-mr-leak -- the failing entry's MR is released before the list is unwound */
			kfree(mr);
			goto out;
		}
		mr->conn = conn;
		mr->state = SDX_MR_READY;
		list_add_tail(&mr->list, &conn->mr_list);
	}
	atomic_set(&conn->mr_ready_count, conn->responder_resources * 2);
	return 0;
out:
	sdx_destroy_mr_list(conn);
	return -ENOMEM;
}

static struct sdx_mr *sdx_get_mr(struct sdx_conn *conn)
{
	struct sdx_mr *mr;

	list_for_each_entry(mr, &conn->mr_list, list)
		if (mr->state == SDX_MR_READY) {
			mr->state = SDX_MR_REGISTERED;
			atomic_dec(&conn->mr_ready_count);
			return mr;
		}
	return NULL;
}

struct sdx_mr *sdx_register_mr(struct sdx_conn *conn, int num_pages,
			       bool writing)
{
	struct sdx_mr *mr = sdx_get_mr(conn);
	int n;

	if (!mr)
		return NULL;
	mr->need_invalidate = true;
	mr->sgl_count = num_pages;
	mr->dir = writing ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	if (!ib_dma_map_sg(conn->id->device, mr->sgl, num_pages, mr->dir))
		goto err;
	/* BUG: rdma-local-mr-management -- the client maps pages into its MR */
	n = ib_map_mr_sg(mr->mr, mr->sgl, num_pages, NULL, SZ_4K);
	if (n != num_pages) {
		ib_dma_unmap_sg(conn->id->device, mr->sgl, num_pages, mr->dir);
		goto err;
	}

	memset(&mr->reg_wr, 0, sizeof(mr->reg_wr));
	mr->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the client */
	mr->reg_wr.wr.wr_cqe = &mr->cqe;
	mr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	mr->reg_wr.mr = mr->mr; /* BUG: rdma-rkey-reuse -- the list's MRs are registered again and again with the same rkey */
	mr->reg_wr.key = mr->mr->rkey;
	/* BUG: rdma-access-flags-invalid -- the server-writes (SMB2 READ) branch has REMOTE_WRITE without LOCAL_WRITE */
	mr->reg_wr.access = writing ? IB_ACCESS_REMOTE_READ :
				      IB_ACCESS_REMOTE_WRITE;
	if (ib_post_send(conn->id->qp, &mr->reg_wr.wr, NULL)) {
		ib_dma_unmap_sg(conn->id->device, mr->sgl, num_pages, mr->dir);
		goto err;
	}
	conn->last_registered = mr;
	return mr;
err:
	mr->state = SDX_MR_ERROR;
	return NULL;
}

static void sdx_local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdx_mr *mr = container_of(wc->wr_cqe, struct sdx_mr, cqe);

	if (wc->status != IB_WC_SUCCESS)
		mr->state = SDX_MR_ERROR;
	complete(&mr->invalidate_done);
}

int sdx_deregister_mr(struct sdx_mr *mr)
{
	struct sdx_conn *conn = mr->conn;
	int rc;

	if (mr->need_invalidate) {
		mr->inv_wr.opcode = IB_WR_LOCAL_INV;
		mr->inv_wr.next = NULL;
		mr->inv_wr.num_sge = 0;
		mr->inv_wr.send_flags = IB_SEND_SIGNALED;
		mr->inv_wr.ex.invalidate_rkey = mr->mr->rkey;
		mr->cqe.done = sdx_local_inv_done;
		mr->inv_wr.wr_cqe = &mr->cqe;
		init_completion(&mr->invalidate_done);
		rc = ib_post_send(conn->id->qp, &mr->inv_wr, NULL);
		if (rc) {
			mr->state = SDX_MR_ERROR;
			return rc;
		}
		wait_for_completion(&mr->invalidate_done);
		mr->need_invalidate = false;
	}

	if (mr->state != SDX_MR_ERROR) {
		ib_dma_unmap_sg(conn->id->device, mr->sgl, mr->sgl_count, mr->dir); /* OK: rdma-unmap-before-invalidate -- the signaled LOCAL_INV was waited for (or the key was invalidated remotely) */
		mr->state = SDX_MR_READY;
		atomic_inc(&conn->mr_ready_count);
		wake_up(&conn->wait_mr);
	}
	return 0;
}
