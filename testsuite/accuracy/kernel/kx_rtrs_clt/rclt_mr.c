// SPDX-License-Identifier: GPL-2.0
/*
 * rclt_mr.c - pool of fast-registration MRs for WRITE requests.
 *
 * MRs are allocated at connect time and kept on con->mr_ready_list.  A
 * WRITE takes one, maps the data and posts a signaled REG_MR.  When the
 * I/O is done the MR is either already invalidated by the server (checked
 * by the caller) or gets a signaled LOCAL_INV; rclt_mr_deregister() waits
 * for it, unmaps the data, moves the key on and returns the MR to the
 * ready list.  MRs whose work requests failed are replaced by the recovery
 * work.
 *
 * Correct here: pool allocation, registration, the synchronous
 * deregistration and the recovery work.
 * Wrong here: rclt_mr_deregister_nowait() (used from the timeout work)
 * unmaps and recycles right after posting its LOCAL_INV.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this module
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/mm.h>
#include "rclt.h"

static void rclt_mr_put_ready(struct rclt_con *con, struct rclt_mr *mr)
{
	unsigned long flags;

	mr->state = RCLT_MR_READY;
	spin_lock_irqsave(&con->mr_lock, flags);
	list_add_tail(&mr->list, &con->mr_ready_list);
	spin_unlock_irqrestore(&con->mr_lock, flags);
	wake_up(&con->wait_mr);
}

static struct rclt_mr *rclt_get_mr(struct rclt_con *con)
{
	struct rclt_mr *mr;
	unsigned long flags;

again:
	wait_event(con->wait_mr,
		   !list_empty(&con->mr_ready_list) || !con->connected);
	if (!con->connected)
		return NULL;

	spin_lock_irqsave(&con->mr_lock, flags);
	mr = list_first_entry_or_null(&con->mr_ready_list, struct rclt_mr,
				      list);
	if (mr)
		list_del(&mr->list);
	spin_unlock_irqrestore(&con->mr_lock, flags);
	if (!mr)
		goto again;
	return mr;
}

void rclt_destroy_mrs(struct rclt_con *con)
{
	struct rclt_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &con->mr_all, all) {
		list_del(&mr->all);
		if (mr->mr)
			ib_dereg_mr(mr->mr);
		if (mr->sgl_count)
			ib_dma_unmap_sg(con->dev, mr->sgl, mr->sgl_count,
					mr->dir);
		kfree(mr->sgl);
		kfree(mr);
	}
	INIT_LIST_HEAD(&con->mr_ready_list);
}

int rclt_alloc_mrs(struct rclt_con *con)
{
	struct rclt_mr *mr;
	int i;

	INIT_LIST_HEAD(&con->mr_ready_list);
	INIT_LIST_HEAD(&con->mr_all);
	for (i = 0; i < con->mr_cnt; i++) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			goto out;
		mr->mr = ib_alloc_mr(con->pd, IB_MR_TYPE_MEM_REG, con->max_pages);
		if (IS_ERR(mr->mr)) {
			kfree(mr);
			goto out;
		}
		mr->sgl = kcalloc(con->max_pages, sizeof(*mr->sgl), GFP_KERNEL);
		if (!mr->sgl) {
			ib_dereg_mr(mr->mr);
			kfree(mr); /* OK: rdma-mr-leak -- MR deregistered before its holder is freed */
			goto out;
		}
		mr->con = con;
		init_completion(&mr->invalidate_done);
		list_add_tail(&mr->all, &con->mr_all);
		rclt_mr_put_ready(con, mr);
	}
	return 0;

out:
	rclt_destroy_mrs(con);
	return -ENOMEM;
}

static void rclt_reg_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rclt_mr *mr = container_of(wc->wr_cqe, struct rclt_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		pr_err("rclt: REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
		mr->state = RCLT_MR_ERROR;
		rclt_con_error(mr->con);
	}
}

struct rclt_mr *rclt_mr_register(struct rclt_con *con, struct scatterlist *sg,
				 int nents, bool writing)
{
	struct rclt_mr *mr;
	int rc, i;

	if (nents > con->max_pages)
		return NULL;

	mr = rclt_get_mr(con);
	if (!mr)
		return NULL;

	sg_init_table(mr->sgl, nents);
	for (i = 0; i < nents; i++)
		sg_set_page(&mr->sgl[i], sg_page(&sg[i]), sg[i].length,
			    sg[i].offset);
	mr->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;

	rc = ib_dma_map_sg(con->dev, mr->sgl, nents, mr->dir);
	if (!rc)
		goto dma_map_error;
	mr->sgl_count = nents;

	rc = ib_map_mr_sg(mr->mr, mr->sgl, nents, NULL, PAGE_SIZE);
	if (rc != nents)
		goto map_mr_error;

	mr->cqe.done = rclt_reg_mr_done;
	memset(&mr->wr, 0, sizeof(mr->wr));
	mr->wr.wr.opcode = IB_WR_REG_MR;
	mr->wr.wr.wr_cqe = &mr->cqe;
	mr->wr.wr.num_sge = 0;
	mr->wr.wr.send_flags = IB_SEND_SIGNALED;
	mr->wr.mr = mr->mr; /* OK: rdma-rkey-reuse -- the key is moved on each time the MR goes back to the ready list */
	mr->wr.key = mr->mr->rkey;
	mr->wr.access = writing ?
			IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			IB_ACCESS_REMOTE_READ;

	rc = ib_post_send(con->qp, &mr->wr.wr, NULL);
	if (!rc) {
		mr->state = RCLT_MR_REGISTERED;
		mr->need_invalidate = true;
		return mr;
	}
	pr_err("rclt: posting REG_MR failed (%d)\n", rc);
	rclt_con_error(con);

map_mr_error:
	ib_dma_unmap_sg(con->dev, mr->sgl, mr->sgl_count, mr->dir); /* OK: rdma-invalidation-leak -- the REG_MR was not posted */
	mr->sgl_count = 0;
dma_map_error:
	mr->state = RCLT_MR_ERROR;
	schedule_work(&con->mr_recovery_work);
	return NULL;
}

static void rclt_local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rclt_mr *mr = container_of(wc->wr_cqe, struct rclt_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		pr_err("rclt: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		mr->state = RCLT_MR_ERROR;
	} else {
		mr->state = RCLT_MR_INVALIDATED;
	}
	complete(&mr->invalidate_done);
}

static int rclt_post_local_inv(struct rclt_mr *mr)
{
	struct ib_send_wr *wr = &mr->inv_wr;

	memset(wr, 0, sizeof(*wr));
	wr->opcode = IB_WR_LOCAL_INV;
	wr->ex.invalidate_rkey = mr->mr->rkey;
	mr->cqe.done = rclt_local_inv_done;
	wr->wr_cqe = &mr->cqe;
	wr->num_sge = 0;
	wr->send_flags = IB_SEND_SIGNALED;
	reinit_completion(&mr->invalidate_done);
	return ib_post_send(mr->con->qp, wr, NULL);
}

/* Process context. */
int rclt_mr_deregister(struct rclt_mr *mr)
{
	struct rclt_con *con = mr->con;
	int rc;

	if (mr->need_invalidate) {
		rc = rclt_post_local_inv(mr);
		if (rc) {
			mr->state = RCLT_MR_ERROR;
			rclt_con_error(con);
			goto out;
		}
		wait_for_completion(&mr->invalidate_done);
		mr->need_invalidate = false;
	} else {
		/* the server's SEND_WITH_INV already hit this rkey */
		mr->state = RCLT_MR_INVALIDATED;
	}

	if (mr->state == RCLT_MR_INVALIDATED) {
		ib_dma_unmap_sg(con->dev, mr->sgl, mr->sgl_count, mr->dir); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the LOCAL_INV completed successfully */
		mr->sgl_count = 0;
		ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));
		rclt_mr_put_ready(con, mr);
		return 0;
	}
out:
	schedule_work(&con->mr_recovery_work);
	return -EIO;
}

/* Must not sleep: the timeout work uses it on a connection that may be hung. */
void rclt_mr_deregister_nowait(struct rclt_mr *mr)
{
	struct rclt_con *con = mr->con;

	if (mr->need_invalidate && rclt_post_local_inv(mr)) {
		mr->state = RCLT_MR_ERROR;
		schedule_work(&con->mr_recovery_work);
		return;
	}
	mr->need_invalidate = false;

	ib_dma_unmap_sg(con->dev, mr->sgl, mr->sgl_count, mr->dir); /* BUG: rdma-unmap-before-invalidate -- the signaled LOCAL_INV has not completed; the server can still read these pages */
	mr->sgl_count = 0;
	ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));
	rclt_mr_put_ready(con, mr);
}

void rclt_mr_recovery_work(struct work_struct *work)
{
	struct rclt_con *con = container_of(work, struct rclt_con,
					    mr_recovery_work);
	struct rclt_mr *mr;
	struct ib_mr *fresh;

	list_for_each_entry(mr, &con->mr_all, all) {
		if (mr->state != RCLT_MR_ERROR)
			continue;

		if (mr->mr)
			ib_dereg_mr(mr->mr);
		if (mr->sgl_count) {
			ib_dma_unmap_sg(con->dev, mr->sgl, mr->sgl_count, mr->dir); /* OK: rdma-invalidation-leak -- deregistered first */
			mr->sgl_count = 0;
		}

		fresh = ib_alloc_mr(con->pd, IB_MR_TYPE_MEM_REG, con->max_pages);
		if (IS_ERR(fresh)) {
			mr->mr = NULL;
			rclt_con_error(con);
			return;
		}
		mr->mr = fresh; /* OK: rdma-mr-leak -- the old MR was deregistered above */
		mr->need_invalidate = false;
		rclt_mr_put_ready(con, mr);
	}
}
