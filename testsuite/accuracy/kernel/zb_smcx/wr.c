// SPDX-License-Identifier: GPL-2.0
/*
 * wr.c - work requests of an SMC-R style link: CDC messages from the tx
 * slot array (with the RDMA WRITEs of the data chained in front), memory
 * registration of buffers, and the receive ring.
 *
 * Only the CDC SEND of a slot is signaled; its completion releases the
 * slot and retires the WRITEs ahead of it. The registration work request
 * picks IB_ACCESS_REMOTE_WRITE for RMBs but forgets IB_ACCESS_LOCAL_WRITE.
 */

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/jiffies.h>
#include <rdma/ib_verbs.h>
#include "smcx.h"

static void smcx_wr_tx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcx_wr_tx_pend *pend =
		container_of(wc->wr_cqe, struct smcx_wr_tx_pend, cqe);
	struct smcx_link *lnk = pend->link;
	unsigned long flags;

	if (pend->handler)
		pend->handler(pend, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
	spin_lock_irqsave(&lnk->wr_tx_lock, flags);
	lnk->wr_tx_used[pend->idx] = false;
	spin_unlock_irqrestore(&lnk->wr_tx_lock, flags);
	wake_up(&lnk->wr_tx_wait);
}

static int smcx_wr_tx_try_get(struct smcx_link *lnk, u32 *idx)
{
	unsigned long flags;
	u32 i;

	spin_lock_irqsave(&lnk->wr_tx_lock, flags);
	for (i = 0; i < SMCX_WR_BUF_CNT; i++) {
		if (!lnk->wr_tx_used[i]) {
			lnk->wr_tx_used[i] = true;
			*idx = i;
			spin_unlock_irqrestore(&lnk->wr_tx_lock, flags);
			return 0;
		}
	}
	spin_unlock_irqrestore(&lnk->wr_tx_lock, flags);
	return -EBUSY;
}

static int smcx_wr_tx_get_slot(struct smcx_link *lnk, u32 *idx)
{
	wait_event(lnk->wr_tx_wait,
		   !smcx_wr_tx_try_get(lnk, idx) || !lnk->active);
	return lnk->active ? 0 : -ENOTCONN;
}

/*
 * Send one CDC message. [off, off + len) of the send buffer ring (size
 * ring_size) goes to the same offsets of the peer's RMB first; when the
 * range wraps, two RDMA WRITEs are needed.
 */
int smcx_cdc_send(struct smcx_link *lnk, struct smcx_buf_desc *sndbuf,
		  u32 off, u32 len, u32 ring_size, u64 peer_addr,
		  u32 peer_rkey, const void *cdc, u32 cdc_len)
{
	struct ib_send_wr *first;
	struct smcx_wr_tx_pend *pend;
	u32 idx, chunk, nwr = 0;
	u64 base;
	u32 lkey;
	int rc;

	if (cdc_len > SMCX_WR_BUF_SIZE)
		return -EINVAL;
	rc = smcx_wr_tx_get_slot(lnk, &idx);
	if (rc)
		return rc;

	pend = &lnk->wr_tx_pends[idx];
	pend->link = lnk;
	pend->idx = idx;
	pend->cqe.done = smcx_wr_tx_done;
	memcpy(lnk->wr_tx_bufs + idx * SMCX_WR_BUF_SIZE, cdc, cdc_len);

	lnk->wr_tx_sges[idx].addr = lnk->wr_tx_dma_addr + idx * SMCX_WR_BUF_SIZE;
	lnk->wr_tx_sges[idx].length = cdc_len;
	lnk->wr_tx_sges[idx].lkey = lnk->roce_pd->local_dma_lkey;
	lnk->wr_tx_ibs[idx].next = NULL;
	lnk->wr_tx_ibs[idx].wr_cqe = &pend->cqe;
	lnk->wr_tx_ibs[idx].opcode = IB_WR_SEND;
	lnk->wr_tx_ibs[idx].sg_list = &lnk->wr_tx_sges[idx];
	lnk->wr_tx_ibs[idx].num_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- every CDC SEND is signaled and retires the WRITEs chained ahead of it */
	lnk->wr_tx_ibs[idx].send_flags = IB_SEND_SIGNALED | IB_SEND_SOLICITED;
	first = &lnk->wr_tx_ibs[idx];

	base = sg_dma_address(sndbuf->sgt[lnk->link_idx].sgl);
	lkey = sndbuf->is_vm ? sndbuf->mr[lnk->link_idx]->lkey :
			       lnk->roce_pd->local_dma_lkey;
	while (len) {
		struct ib_rdma_wr *w = &lnk->wr_tx_rdmas[idx][nwr];
		struct ib_sge *sge = &lnk->wr_tx_rdma_sges[idx][nwr];

		chunk = min_t(u32, len, ring_size - off);
		sge->addr = base + off;
		sge->length = chunk;
		sge->lkey = lkey;
		/* OK: rdma-access-flags-transport -- RDMA WRITE sources need no remote rights on any transport */
		w->wr.opcode = IB_WR_RDMA_WRITE;
		w->wr.sg_list = sge;
		w->wr.num_sge = 1;
		w->wr.send_flags = 0;
		w->wr.wr_cqe = NULL;
		w->remote_addr = peer_addr + off;
		w->rkey = peer_rkey;
		nwr++;
		len -= chunk;
		off = (off + chunk) % ring_size;
	}
	if (nwr == 2)
		lnk->wr_tx_rdmas[idx][1].wr.next = first;
	if (nwr) {
		lnk->wr_tx_rdmas[idx][0].wr.next =
			nwr == 2 ? &lnk->wr_tx_rdmas[idx][1].wr : first;
		first = &lnk->wr_tx_rdmas[idx][0].wr;
	}

	rc = ib_post_send(lnk->roce_qp, first, NULL);
	if (rc) {
		spin_lock(&lnk->wr_tx_lock);
		lnk->wr_tx_used[idx] = false;
		spin_unlock(&lnk->wr_tx_lock);
	}
	return rc;
}

static void smcx_wr_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcx_link *lnk = container_of(wc->wr_cqe, struct smcx_link,
					     wr_reg_cqe);

	lnk->wr_reg_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&lnk->wr_reg_done);
}

/* Register a buffer's MR on this link and wait for the completion. */
int smcx_wr_reg_send(struct smcx_link *lnk, struct ib_mr *mr, bool is_rmb)
{
	unsigned long left;
	int rc;

	mutex_lock(&lnk->wr_reg_mutex);
	memset(&lnk->wr_reg, 0, sizeof(lnk->wr_reg));
	lnk->wr_reg_cqe.done = smcx_wr_reg_done;
	lnk->wr_reg.wr.wr_cqe = &lnk->wr_reg_cqe;
	lnk->wr_reg.wr.opcode = IB_WR_REG_MR;	/* BUG: rdma-local-mr-management -- the ULP posts its own REG_MR */
	lnk->wr_reg.wr.send_flags = IB_SEND_SIGNALED;
	lnk->wr_reg.mr = mr;
	lnk->wr_reg.key = mr->rkey;
	/* peers write into RMBs; send buffers are only read locally */
	lnk->wr_reg.access = is_rmb ? IB_ACCESS_REMOTE_WRITE :	/* BUG: rdma-access-flags-invalid -- RMBs get remote write without IB_ACCESS_LOCAL_WRITE */
				      IB_ACCESS_LOCAL_WRITE;

	reinit_completion(&lnk->wr_reg_done);
	rc = ib_post_send(lnk->roce_qp, &lnk->wr_reg.wr, NULL);
	if (rc)
		goto out;
	left = wait_for_completion_timeout(&lnk->wr_reg_done,
					   msecs_to_jiffies(SMCX_WR_REG_WAIT_MS));
	if (!left)
		rc = -ETIMEDOUT;
	else
		rc = lnk->wr_reg_status;
out:
	mutex_unlock(&lnk->wr_reg_mutex);
	return rc;
}

/* ---- receive ring ---- */

static void smcx_wr_rx_done(struct ib_cq *cq, struct ib_wc *wc);

static int smcx_wr_rx_post(struct smcx_link *lnk, u32 idx)
{
	struct smcx_wr_rx_pend *pend = &lnk->wr_rx_pends[idx];

	pend->link = lnk;
	pend->idx = idx;
	pend->cqe.done = smcx_wr_rx_done;
	lnk->wr_rx_ibs[idx].next = NULL;
	lnk->wr_rx_ibs[idx].wr_cqe = &pend->cqe;
	lnk->wr_rx_ibs[idx].sg_list = &lnk->wr_rx_sges[idx];
	lnk->wr_rx_ibs[idx].num_sge = 1;
	return ib_post_recv(lnk->roce_qp, &lnk->wr_rx_ibs[idx], NULL);
}

static void smcx_wr_rx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcx_wr_rx_pend *pend =
		container_of(wc->wr_cqe, struct smcx_wr_rx_pend, cqe);
	struct smcx_link *lnk = pend->link;

	if (wc->status != IB_WC_SUCCESS)
		return;
	ib_dma_sync_single_for_cpu(lnk->ibdev, lnk->wr_rx_sges[pend->idx].addr,
				   SMCX_WR_BUF_SIZE, DMA_FROM_DEVICE);
	smcx_cdc_rx(lnk, lnk->wr_rx_bufs + pend->idx * SMCX_WR_BUF_SIZE,
		    wc->byte_len);
	if (lnk->active)
		smcx_wr_rx_post(lnk, pend->idx);
}

int smcx_wr_rx_post_all(struct smcx_link *lnk)
{
	u32 i;
	int rc;

	for (i = 0; i < SMCX_WR_RX_CNT; i++) {
		lnk->wr_rx_sges[i].addr = lnk->wr_rx_dma_addr + i * SMCX_WR_BUF_SIZE;
		lnk->wr_rx_sges[i].length = SMCX_WR_BUF_SIZE;
		lnk->wr_rx_sges[i].lkey = lnk->roce_pd->local_dma_lkey;
		rc = smcx_wr_rx_post(lnk, i);
		if (rc)
			return rc;
	}
	return 0;
}

int smcx_wr_alloc_link_mem(struct smcx_link *lnk)
{
	lnk->wr_tx_bufs = kcalloc(SMCX_WR_BUF_CNT, SMCX_WR_BUF_SIZE, GFP_KERNEL);
	lnk->wr_rx_bufs = kcalloc(SMCX_WR_RX_CNT, SMCX_WR_BUF_SIZE, GFP_KERNEL);
	if (!lnk->wr_tx_bufs || !lnk->wr_rx_bufs)
		goto err;
	lnk->wr_tx_dma_addr = ib_dma_map_single(lnk->ibdev, lnk->wr_tx_bufs,
						SMCX_WR_BUF_CNT * SMCX_WR_BUF_SIZE,
						DMA_TO_DEVICE);
	if (ib_dma_mapping_error(lnk->ibdev, lnk->wr_tx_dma_addr))
		goto err;
	lnk->wr_rx_dma_addr = ib_dma_map_single(lnk->ibdev, lnk->wr_rx_bufs,
						SMCX_WR_RX_CNT * SMCX_WR_BUF_SIZE,
						DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(lnk->ibdev, lnk->wr_rx_dma_addr)) {
		ib_dma_unmap_single(lnk->ibdev, lnk->wr_tx_dma_addr,
				    SMCX_WR_BUF_CNT * SMCX_WR_BUF_SIZE,
				    DMA_TO_DEVICE);
		goto err;
	}
	return 0;
err:
	kfree(lnk->wr_tx_bufs);
	kfree(lnk->wr_rx_bufs);
	lnk->wr_tx_bufs = NULL;
	lnk->wr_rx_bufs = NULL;
	return -ENOMEM;
}

void smcx_wr_free_link_mem(struct smcx_link *lnk)
{
	if (!lnk->wr_tx_bufs)
		return;
	ib_dma_unmap_single(lnk->ibdev, lnk->wr_rx_dma_addr,
			    SMCX_WR_RX_CNT * SMCX_WR_BUF_SIZE, DMA_FROM_DEVICE);
	ib_dma_unmap_single(lnk->ibdev, lnk->wr_tx_dma_addr,
			    SMCX_WR_BUF_CNT * SMCX_WR_BUF_SIZE, DMA_TO_DEVICE);
	kfree(lnk->wr_tx_bufs);
	kfree(lnk->wr_rx_bufs);
	lnk->wr_tx_bufs = NULL;
	lnk->wr_rx_bufs = NULL;
}
