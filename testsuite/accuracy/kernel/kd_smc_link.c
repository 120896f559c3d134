// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0
/*
 * kd_smc_link.c - SMC-R-like link layer: RMBs (receive buffers the peer
 * RDMA-WRITEs into) are registered once per link with remote write access;
 * their rkeys travel in CONFIRM_RKEY link messages.  A link group (lgr) has
 * up to three links to one peer; the PD belongs to the RoCE device and is
 * shared by every link group on it.  A CDC message is posted as one chain:
 * WRITE(s) into the peer's RMB, then the CDC SEND.
 *
 * Correct: RMB MRs are registered once per link and deregistered before the
 * memory goes; a failed map releases the fresh MR; every chain is signaled.
 * Not correct: the "spare RMB" cache keeps buffers registered when their
 * link group goes away and registers them again for the next peer under the
 * same key; teardown unmaps the pages before the keys die; a failed buffer
 * creation frees a buffer still registered on other links; link-down drops
 * MR pointers; vmalloc'ed send buffers get an MR per message, with a
 * remote-read right whose key nobody receives; the send queue is too small
 * for one CDC chain and its size is never checked against the device.
 */
#include <linux/types.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/string.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define KD_SMC_LINKS		3
#define KD_SMC_WR_BUF_CNT	768	/* CDC send slots per link */
#define KD_SMC_RX_CNT		256
#define KD_SMC_SPARE_ORDER	2	/* 16K RMBs, the common size, are kept */
#define KD_SMC_REG_TMO_MS	5000

enum { KD_REG_POSTED, KD_REG_CONFIRMED, KD_REG_FAILED };

struct kd_smc_ibdev {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;		/* shared by all link groups */
	spinlock_t		 spare_lock;
	struct list_head	 spare_rmbs;
};

struct kd_smc_buf {
	struct list_head	 list;
	void			*cpu_addr;
	int			 order;
	struct scatterlist	 sg;
	bool			 mapped;
	struct ib_mr		*mr[KD_SMC_LINKS];
};

struct kd_smc_lgr;

struct kd_smc_link {
	struct kd_smc_lgr	*lgr;
	struct kd_smc_ibdev	*smcibdev;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u8			 link_idx;
	bool			 active;
	int			 wr_reg_state;
	wait_queue_head_t	 wr_reg_wait;
	struct ib_cqe		 reg_cqe;
	struct ib_reg_wr	 wr_reg;
};

struct kd_smc_lgr {
	struct kd_smc_ibdev	*smcibdev;
	struct kd_smc_link	 lnk[KD_SMC_LINKS];
	struct list_head	 rmbs;
};

/* one CDC message: up to two WRITEs (RMB wrap) and the CDC SEND */
struct kd_smc_tx {
	struct ib_mr		*src_mr;	/* vmalloc'ed sndbuf only */
	struct ib_reg_wr	 src_reg;
	struct ib_rdma_wr	 rdma[2];
	struct ib_sge		 rdma_sge[2];
	struct ib_send_wr	 cdc_wr;
	struct ib_sge		 cdc_sge;
	struct ib_cqe		 cqe;
};

struct kd_smc_llc_confirm_rkey {
	u8			 type;
	u8			 num_rkeys;
	__be32			 rmb_key[KD_SMC_LINKS];
	__be64			 rmb_vaddr;
};

int kd_smc_llc_send(struct kd_smc_link *lnk, void *msg, size_t len);
void kd_smc_link_down_cond_sched(struct kd_smc_link *lnk);
void kd_smc_tx_put_slot(struct kd_smc_tx *tx);

static void kd_smc_wr_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_smc_link *lnk = container_of(wc->wr_cqe, struct kd_smc_link,
					       reg_cqe);

	lnk->wr_reg_state = wc->status == IB_WC_SUCCESS ? KD_REG_CONFIRMED :
							  KD_REG_FAILED;
	wake_up(&lnk->wr_reg_wait);
}

static int kd_smc_wr_reg_send(struct kd_smc_link *lnk, struct ib_mr *mr)
{
	long left;
	int rc;

	memset(&lnk->wr_reg, 0, sizeof(lnk->wr_reg));
	lnk->reg_cqe.done = kd_smc_wr_reg_done;
	lnk->wr_reg.wr.wr_cqe = &lnk->reg_cqe;
	lnk->wr_reg.wr.opcode = IB_WR_REG_MR;
	lnk->wr_reg.wr.send_flags = IB_SEND_SIGNALED;
	lnk->wr_reg.mr = mr;	// BUG: rdma-rkey-reuse -- RMBs taken from the spare cache come back with their MR and are registered again under the key the previous peer was given
	lnk->wr_reg.key = mr->rkey;
	lnk->wr_reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is set, and the key goes out in CONFIRM_RKEY */

	lnk->wr_reg_state = KD_REG_POSTED;
	rc = ib_post_send(lnk->qp, &lnk->wr_reg.wr, NULL);
	if (rc)
		return rc;
	left = wait_event_timeout(lnk->wr_reg_wait,
				  lnk->wr_reg_state != KD_REG_POSTED,
				  msecs_to_jiffies(KD_SMC_REG_TMO_MS));
	if (!left) {
		kd_smc_link_down_cond_sched(lnk);
		return -ETIMEDOUT;
	}
	return lnk->wr_reg_state == KD_REG_CONFIRMED ? 0 : -EIO;
}

/* Register an RMB on one link; on failure the link's MR is gone again. */
static int kd_smc_buf_reg_link(struct kd_smc_link *lnk, struct kd_smc_buf *buf)
{
	u8 idx = lnk->link_idx;
	int rc;

	if (!buf->mr[idx]) {
		buf->mr[idx] = ib_alloc_mr(lnk->smcibdev->pd, /* OK: rdma-registration-in-datapath -- allocated on first use and kept for the RMB's lifetime, at connection setup */
					   IB_MR_TYPE_MEM_REG, 1 << buf->order);
		if (IS_ERR(buf->mr[idx])) {
			rc = PTR_ERR(buf->mr[idx]);
			buf->mr[idx] = NULL;
			return rc;
		}
	}
	if (ib_map_mr_sg(buf->mr[idx], &buf->sg, 1, NULL, PAGE_SIZE) != 1) {
		ib_dereg_mr(buf->mr[idx]);	/* OK: rdma-mr-leak -- the MR is released before the error return */
		buf->mr[idx] = NULL;
		return -EINVAL;
	}
	rc = kd_smc_wr_reg_send(lnk, buf->mr[idx]);
	if (rc) {
		ib_dereg_mr(buf->mr[idx]);
		buf->mr[idx] = NULL;
	}
	return rc;
}

static struct kd_smc_buf *kd_smc_buf_alloc(struct kd_smc_lgr *lgr, int order)
{
	struct kd_smc_ibdev *smcibdev = lgr->smcibdev;
	struct kd_smc_buf *buf = NULL;

	if (order == KD_SMC_SPARE_ORDER) {
		spin_lock(&smcibdev->spare_lock);
		buf = list_first_entry_or_null(&smcibdev->spare_rmbs,
					       struct kd_smc_buf, list);
		if (buf)
			list_del(&buf->list);
		spin_unlock(&smcibdev->spare_lock);
		if (buf)
			return buf;
	}

	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return NULL;
	buf->order = order;
	buf->cpu_addr = kzalloc(PAGE_SIZE << order, GFP_KERNEL);
	if (!buf->cpu_addr)
		goto out_free;
	sg_init_one(&buf->sg, buf->cpu_addr, PAGE_SIZE << order);
	if (!ib_dma_map_sg(smcibdev->ibdev, &buf->sg, 1, DMA_BIDIRECTIONAL))
		goto out_cpu;
	buf->mapped = true;
	return buf;

out_cpu:
	kfree(buf->cpu_addr);
out_free:
	kfree(buf);
	return NULL;
}

struct kd_smc_buf *kd_smc_buf_create(struct kd_smc_lgr *lgr, int order)
{
	struct kd_smc_buf *buf;
	int i, rc;

	buf = kd_smc_buf_alloc(lgr, order);
	if (!buf)
		return ERR_PTR(-ENOMEM);

	for (i = 0; i < KD_SMC_LINKS; i++) {
		if (!lgr->lnk[i].active)
			continue;
		rc = kd_smc_buf_reg_link(&lgr->lnk[i], buf);
		if (rc)
			goto out_free;
	}
	list_add(&buf->list, &lgr->rmbs);
	return buf;

out_free:
	ib_dma_unmap_sg(lgr->smcibdev->ibdev, &buf->sg, 1, DMA_BIDIRECTIONAL);
	kfree(buf->cpu_addr);
	kfree(buf);	// BUG: rdma-mr-leak, rdma-invalidation-leak -- the MRs of the links that did register are freed with the buffer: never deregistered, their remote-write keys still map the freed pages
	return ERR_PTR(rc);
}

int kd_smc_llc_confirm_rkey(struct kd_smc_link *lnk, struct kd_smc_buf *buf)
{
	struct kd_smc_llc_confirm_rkey msg = { .type = 0x06 };
	int i;

	for (i = 0; i < KD_SMC_LINKS; i++) {
		if (!buf->mr[i])
			continue;
		msg.rmb_key[msg.num_rkeys++] = cpu_to_be32(buf->mr[i]->rkey);
	}
	msg.rmb_vaddr = cpu_to_be64(sg_dma_address(&buf->sg));
	return kd_smc_llc_send(lnk, &msg, sizeof(msg));
}

static void kd_smc_buf_unmap_link(struct kd_smc_buf *buf,
				  struct kd_smc_link *lnk)
{
	if (!buf->mr[lnk->link_idx])
		return;
	ib_dereg_mr(buf->mr[lnk->link_idx]);	/* OK: rdma-invalidation-leak -- deregistration kills the key before anything is released */
	buf->mr[lnk->link_idx] = NULL;
}

/* A single link failed; the link group continues on the others. */
void kd_smc_link_down(struct kd_smc_link *lnk)
{
	struct kd_smc_buf *buf;
	u8 idx = lnk->link_idx;

	lnk->active = false;
	list_for_each_entry(buf, &lnk->lgr->rmbs, list) {
		if (!buf->mr[idx])
			continue;
		/* the peer forgets the rtoken of this link (DELETE_RKEY) */
		buf->mr[idx] = NULL;	// BUG: rdma-mr-leak -- the link's MR is dropped without ib_dereg_mr()
	}
	ib_destroy_qp(lnk->qp);
	lnk->qp = NULL;
}

static void kd_smc_buf_free(struct kd_smc_lgr *lgr, struct kd_smc_buf *buf)
{
	int i;

	if (buf->mapped)
		ib_dma_unmap_sg(lgr->smcibdev->ibdev, &buf->sg, 1, /* BUG: rdma-invalidation-leak -- the pages are unmapped while the RMB's remote-write keys are still registered; they are deregistered only below */
				DMA_BIDIRECTIONAL);
	for (i = 0; i < KD_SMC_LINKS; i++)
		kd_smc_buf_unmap_link(buf, &lgr->lnk[i]);
	kfree(buf->cpu_addr);
	kfree(buf);
}

void kd_smc_lgr_free(struct kd_smc_lgr *lgr)
{
	struct kd_smc_ibdev *smcibdev = lgr->smcibdev;
	struct kd_smc_buf *buf, *next;

	list_for_each_entry_safe(buf, next, &lgr->rmbs, list) {
		list_del(&buf->list);
		if (buf->order == KD_SMC_SPARE_ORDER) {
			/* cheap reuse for the next link group */
			memset(buf->cpu_addr, 0, PAGE_SIZE << buf->order);
			spin_lock(&smcibdev->spare_lock);
			list_add(&buf->list, &smcibdev->spare_rmbs);	// BUG: rdma-invalidation-leak -- the RMB keeps its registered MRs; the keys this peer holds stay valid on the shared PD while the buffer is handed to the next link group
			spin_unlock(&smcibdev->spare_lock);
			continue;
		}
		kd_smc_buf_free(lgr, buf);
	}
}

static void kd_smc_tx_put_src(struct kd_smc_tx *tx)
{
	if (!tx->src_mr)
		return;
	ib_dereg_mr(tx->src_mr);	// BUG: rdma-registration-in-datapath -- and deregistered again from the send completion, once per message
	tx->src_mr = NULL;
}

/* vmalloc'ed sndbufs are not physically contiguous: one MR per message */
static int kd_smc_tx_map_vbuf(struct kd_smc_link *lnk, struct kd_smc_tx *tx,
			      struct scatterlist *sgl, int nents)
{
	tx->src_mr = ib_alloc_mr(lnk->smcibdev->pd, IB_MR_TYPE_MEM_REG, nents);	// BUG: rdma-registration-in-datapath -- an MR is allocated for every CDC message sent from a vmalloc'ed buffer
	if (IS_ERR(tx->src_mr)) {
		tx->src_mr = NULL;
		return -ENOMEM;
	}
	if (ib_map_mr_sg(tx->src_mr, sgl, nents, NULL, PAGE_SIZE) != nents) {
		kd_smc_tx_put_src(tx);
		return -EINVAL;
	}
	tx->src_reg.wr.opcode = IB_WR_REG_MR;
	tx->src_reg.wr.send_flags = 0;
	tx->src_reg.wr.next = &tx->rdma[0].wr;
	tx->src_reg.mr = tx->src_mr;
	tx->src_reg.key = tx->src_mr->rkey;
	/* v2.1 peers may pull the payload with RDMA READ instead */
	tx->src_reg.access = IB_ACCESS_REMOTE_READ;	// BUG: rdma-remote-access-overbroad -- the source MR's rkey is never put in the CDC message, so no peer can use the remote-read right

	tx->rdma_sge[0].addr = tx->src_mr->iova;
	tx->rdma_sge[0].length = tx->src_mr->length;
	tx->rdma_sge[0].lkey = tx->src_mr->lkey;
	return 0;
}

void kd_smc_tx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_smc_tx *tx = container_of(wc->wr_cqe, struct kd_smc_tx, cqe);

	kd_smc_tx_put_src(tx);
	kd_smc_tx_put_slot(tx);
}

int kd_smc_tx_cdc(struct kd_smc_link *lnk, struct kd_smc_tx *tx, int nwrites,
		  struct scatterlist *vsgl, int vnents)
{
	struct ib_send_wr *first;
	int i, rc;

	for (i = 0; i < nwrites; i++) {
		tx->rdma[i].wr.opcode = IB_WR_RDMA_WRITE;
		tx->rdma[i].wr.send_flags = 0;
		tx->rdma[i].wr.sg_list = &tx->rdma_sge[i];
		tx->rdma[i].wr.num_sge = 1;
		tx->rdma[i].wr.next = i + 1 < nwrites ? &tx->rdma[i + 1].wr :
							&tx->cdc_wr;
	}
	tx->cdc_wr.opcode = IB_WR_SEND;
	tx->cdc_wr.send_flags = IB_SEND_SIGNALED | IB_SEND_SOLICITED;
	tx->cqe.done = kd_smc_tx_done;
	tx->cdc_wr.wr_cqe = &tx->cqe;
	tx->cdc_wr.sg_list = &tx->cdc_sge;
	tx->cdc_wr.num_sge = 1;
	tx->cdc_wr.next = NULL;
	first = nwrites ? &tx->rdma[0].wr : &tx->cdc_wr;

	if (vsgl && nwrites) {
		rc = kd_smc_tx_map_vbuf(lnk, tx, vsgl, vnents);
		if (rc)
			return rc;
		first = &tx->src_reg.wr;
	}
	return ib_post_send(lnk->qp, first, NULL);
}

int kd_smc_create_qp(struct kd_smc_link *lnk)
{
	struct ib_qp_init_attr attr = {
		.qp_context = lnk,
		.send_cq = lnk->cq,
		.recv_cq = lnk->cq,
		.cap = {
			.max_send_wr = KD_SMC_WR_BUF_CNT * 2,	// BUG(file): rdma-send-queue-undersized, rdma-queue-cap-unchecked -- a CDC message posts up to REG_MR+WRITE+WRITE+SEND (4 WRs) per slot; and 1536 WRs are requested without looking at attrs.max_qp_wr
			.max_recv_wr = KD_SMC_RX_CNT,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
		.sq_sig_type = IB_SIGNAL_REQ_WR,	/* OK: rdma-unsignaled-send-starvation -- the CDC SEND that ends every chain is signaled */
		.qp_type = IB_QPT_RC,
	};

	lnk->qp = ib_create_qp(lnk->smcibdev->pd, &attr);
	if (IS_ERR(lnk->qp))
		return PTR_ERR(lnk->qp);
	init_waitqueue_head(&lnk->wr_reg_wait);
	return 0;
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kd SMC-R-like link layer");
