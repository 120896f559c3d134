// SPDX-License-Identifier: GPL-2.0
/*
 * link.c - link groups and links of the SMC-R style module: one RC QP per
 * link, sized for the fixed array of CDC tx slots (each CDC SEND may be
 * preceded by two RDMA WRITEs). The link-level queue sizes are constants
 * that were raised to 512 slots without looking at the device limits, and
 * the send queue leaves no entry for the ib_drain_qp() at link teardown.
 */

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include "smcx.h"

static void smcx_qp_event(struct ib_event *ev, void *ctx)
{
	struct smcx_link *lnk = ctx;

	pr_warn("smcx: async event on link %d\n", lnk->link_idx);
}

static int smcx_link_create_qp(struct smcx_link *lnk)
{
	struct ib_qp_init_attr qp_attr = {
		.event_handler = smcx_qp_event,
		.qp_context = lnk,
		.send_cq = lnk->send_cq,
		.recv_cq = lnk->recv_cq,
		.srq = NULL,
		.cap = {
			/* two RDMA WRITEs (ring wrap) and the CDC SEND per tx slot */
			/* BUG(program): rdma-send-queue-undersized -- exactly three entries per slot, none left for the ib_drain_qp() in smcx_link_clear() */
			/* BUG: rdma-queue-cap-unchecked -- 1536 work requests, never compared with attrs.max_qp_wr */
			/* OK: rdma-send-queue-manual-factor -- the factor counts data work requests only; buffers are registered once per buffer, not per CDC message */
			.max_send_wr = SMCX_WR_BUF_CNT * 3,
			/* OK: rdma-send-queue-undersized -- one more than the receives kept posted, for the drain */
			/* BUG: rdma-queue-cap-unchecked -- 1537 receive entries, never compared with attrs.max_qp_wr */
			.max_recv_wr = SMCX_WR_RX_CNT + 1,
			.max_send_sge = SMCX_MAX_SEND_SGE,
			.max_recv_sge = SMCX_RX_SGE,
			.max_inline_data = 0,
		},
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.qp_type = IB_QPT_RC,
	};

	lnk->roce_qp = ib_create_qp(lnk->roce_pd, &qp_attr);
	if (IS_ERR(lnk->roce_qp)) {
		int rc = PTR_ERR(lnk->roce_qp);

		lnk->roce_qp = NULL;
		return rc;
	}
	return 0;
}

int smcx_link_init(struct smcx_lgr *lgr, int idx, struct ib_device *ibdev,
		   u32 ibport)
{
	struct smcx_link *lnk = &lgr->lnk[idx];
	int rc;

	lnk->lgr = lgr;
	lnk->link_idx = idx;
	lnk->ibdev = ibdev;
	lnk->ibport = ibport;
	spin_lock_init(&lnk->wr_tx_lock);
	init_waitqueue_head(&lnk->wr_tx_wait);
	mutex_init(&lnk->wr_reg_mutex);
	init_completion(&lnk->wr_reg_done);

	lnk->roce_pd = ib_alloc_pd(ibdev, 0);
	if (IS_ERR(lnk->roce_pd)) {
		rc = PTR_ERR(lnk->roce_pd);
		lnk->roce_pd = NULL;
		return rc;
	}
	lnk->send_cq = ib_cq_pool_get(ibdev, SMCX_WR_BUF_CNT * 3, -1,
				      IB_POLL_SOFTIRQ);
	if (IS_ERR(lnk->send_cq)) {
		rc = PTR_ERR(lnk->send_cq);
		goto err_pd;
	}
	lnk->recv_cq = ib_cq_pool_get(ibdev, SMCX_WR_RX_CNT, -1, IB_POLL_SOFTIRQ);
	if (IS_ERR(lnk->recv_cq)) {
		rc = PTR_ERR(lnk->recv_cq);
		goto err_scq;
	}

	rc = smcx_link_create_qp(lnk);
	if (rc)
		goto err_rcq;
	rc = smcx_wr_alloc_link_mem(lnk);
	if (rc)
		goto err_qp;
	rc = smcx_wr_rx_post_all(lnk);
	if (rc)
		goto err_mem;
	lnk->active = true;
	return 0;

err_mem:
	smcx_wr_free_link_mem(lnk);
err_qp:
	ib_destroy_qp(lnk->roce_qp);
	lnk->roce_qp = NULL;
err_rcq:
	ib_cq_pool_put(lnk->recv_cq, SMCX_WR_RX_CNT);
err_scq:
	ib_cq_pool_put(lnk->send_cq, SMCX_WR_BUF_CNT * 3);
err_pd:
	ib_dealloc_pd(lnk->roce_pd);
	lnk->roce_pd = NULL;
	return rc;
}

/* Take a link down; the buffers of the group stay registered on the
 * remaining links. */
void smcx_link_clear(struct smcx_link *lnk)
{
	struct smcx_lgr *lgr = lnk->lgr;
	struct smcx_buf_desc *buf;
	int i;

	if (!lnk->active)
		return;
	lnk->active = false;
	wake_up_all(&lnk->wr_tx_wait);
	ib_drain_qp(lnk->roce_qp);

	mutex_lock(&lgr->bufs_lock);
	for (i = 0; i < SMCX_RMBE_SIZES; i++) {
		list_for_each_entry(buf, &lgr->rmbs[i], list)
			smcx_buf_unmap_link(buf, lnk);
		list_for_each_entry(buf, &lgr->sndbufs[i], list)
			smcx_buf_unmap_link(buf, lnk);
	}
	mutex_unlock(&lgr->bufs_lock);

	smcx_wr_free_link_mem(lnk);
	ib_destroy_qp(lnk->roce_qp);
	lnk->roce_qp = NULL;
	ib_cq_pool_put(lnk->recv_cq, SMCX_WR_RX_CNT);
	ib_cq_pool_put(lnk->send_cq, SMCX_WR_BUF_CNT * 3);
	ib_dealloc_pd(lnk->roce_pd);
	lnk->roce_pd = NULL;
}

struct smcx_lgr *smcx_lgr_create(struct ib_device *ibdev, u32 ibport)
{
	struct smcx_lgr *lgr;
	int i;

	lgr = kzalloc(sizeof(*lgr), GFP_KERNEL);
	if (!lgr)
		return NULL;
	mutex_init(&lgr->bufs_lock);
	for (i = 0; i < SMCX_RMBE_SIZES; i++) {
		INIT_LIST_HEAD(&lgr->rmbs[i]);
		INIT_LIST_HEAD(&lgr->sndbufs[i]);
	}
	if (smcx_link_init(lgr, 0, ibdev, ibport)) {
		kfree(lgr);
		return NULL;
	}
	return lgr;
}

void smcx_lgr_free(struct smcx_lgr *lgr)
{
	struct smcx_buf_desc *buf, *tmp;
	int i;

	for (i = 0; i < SMCX_LINKS_PER_LGR; i++)
		smcx_link_clear(&lgr->lnk[i]);
	for (i = 0; i < SMCX_RMBE_SIZES; i++) {
		list_for_each_entry_safe(buf, tmp, &lgr->rmbs[i], list)
			smcx_buf_free(lgr, buf);
		list_for_each_entry_safe(buf, tmp, &lgr->sndbufs[i], list)
			smcx_buf_free(lgr, buf);
	}
	kfree(lgr);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("shared memory communications over RDMA, link layer");
