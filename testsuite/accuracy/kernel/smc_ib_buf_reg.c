// SPDX-License-Identifier: GPL-2.0
/*
 * smcb: registration of the receive buffers (RMBs) of an SMC-R-style link
 * (modelled on net/smc/smc_ib.c, smc_core.c and smc_wr.c, written fresh).
 *
 * Each RMB gets one MR per link, allocated and fast-registered once when the
 * buffer is first mapped to the link, with LOCAL_WRITE | REMOTE_WRITE; its
 * rkey goes to the peer in the CLC accept/confirm messages and stays valid
 * for the lifetime of the buffer, which is reused across connections of the
 * same link group. The registration waits for its completion. When a buffer
 * is unmapped from a link the MR is deregistered before the pages are
 * unmapped.
 *
 * Everything here is correct: the MR is registered once (no key rotation
 * needed), and the buffer's unmap path releases an MR left behind by a
 * failed map.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/wait.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define SMCB_LINKS_PER_LGR_MAX	3
#define SMCB_WR_REG_MR_WAIT_TIME	(5 * HZ)

enum smcb_wr_reg_state {
	POSTED,		/* ib_wr_reg_mr request posted */
	CONFIRMED,	/* ib_wr_reg_mr response: successful */
	FAILED		/* ib_wr_reg_mr response: failure */
};

struct smcb_buf_desc {
	struct sg_table		sgt[SMCB_LINKS_PER_LGR_MAX];
	struct ib_mr		*mr[SMCB_LINKS_PER_LGR_MAX];
	bool			is_reg_mr[SMCB_LINKS_PER_LGR_MAX];
	bool			is_map_ib[SMCB_LINKS_PER_LGR_MAX];
	void			*cpu_addr;
	int			order;
};

struct smcb_link {
	struct ib_device	*smcibdev;
	struct ib_pd		*roce_pd;
	struct ib_qp		*roce_qp;
	int			link_idx;
	struct ib_reg_wr	wr_reg;
	struct ib_cqe		wr_reg_cqe;
	wait_queue_head_t	wr_reg_wait;
	enum smcb_wr_reg_state	wr_reg_state;
};

struct smcb_clc_rkey {
	__be32	rmb_rkey;
	__be64	rmb_dma_addr;
};

void smcb_wr_init_reg(struct smcb_link *lnk)
{
	lnk->wr_reg.wr.next = NULL;
	lnk->wr_reg.wr.num_sge = 0;
	lnk->wr_reg.wr.send_flags = IB_SEND_SIGNALED;
	lnk->wr_reg.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- the link fast-registers its buffers itself */
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- REMOTE_WRITE with LOCAL_WRITE; the rkey is sent in the CLC messages */
	lnk->wr_reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	init_waitqueue_head(&lnk->wr_reg_wait);
}

static void smcb_wr_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcb_link *lnk = container_of(wc->wr_cqe, struct smcb_link,
					     wr_reg_cqe);

	lnk->wr_reg_state = wc->status ? FAILED : CONFIRMED;
	wake_up(&lnk->wr_reg_wait);
}

static int smcb_wr_reg_send(struct smcb_link *link, struct ib_mr *mr)
{
	long timeout;
	int rc;

	link->wr_reg_cqe.done = smcb_wr_reg_done;
	link->wr_reg.wr.wr_cqe = &link->wr_reg_cqe;
	link->wr_reg.mr = mr; /* OK: rdma-rkey-reuse -- each buffer's MR is registered exactly once for its lifetime */
	link->wr_reg.key = mr->rkey;
	link->wr_reg_state = POSTED;
	rc = ib_post_send(link->roce_qp, &link->wr_reg.wr, NULL);
	if (rc)
		return rc;

	timeout = wait_event_timeout(link->wr_reg_wait,
				     link->wr_reg_state != POSTED,
				     SMCB_WR_REG_MR_WAIT_TIME);
	if (!timeout)
		return -ETIMEDOUT;
	if (link->wr_reg_state == FAILED)
		return -EIO;
	return 0;
}

static int smcb_get_memory_region(struct ib_pd *pd, struct smcb_buf_desc *buf,
				  u8 link_idx)
{
	unsigned int offset = 0;
	int sg_num;

	if (buf->mr[link_idx])
		return 0; /* already done */

	/* BUG: rdma-local-mr-management -- one MR per buffer and link, allocated by the ULP */
	buf->mr[link_idx] = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, 1 << buf->order); /* OK: rdma-registration-in-datapath -- once per buffer and link when the buffer is first mapped, then kept */
	if (IS_ERR(buf->mr[link_idx])) {
		int rc = PTR_ERR(buf->mr[link_idx]);

		buf->mr[link_idx] = NULL;
		return rc;
	}

	/* BUG: rdma-local-mr-management -- the ULP maps the buffer into its MR */
	sg_num = ib_map_mr_sg(buf->mr[link_idx], buf->sgt[link_idx].sgl,
			      buf->sgt[link_idx].orig_nents, &offset, PAGE_SIZE);
	if (sg_num != 1)
		return -EINVAL; /* OK: rdma-mr-leak -- the MR stays in buf->mr[], and the caller's smcb_buf_unmap_link() deregisters it */
	return 0;
}

void smcb_buf_unmap_link(struct smcb_buf_desc *buf, struct smcb_link *lnk)
{
	if (buf->mr[lnk->link_idx]) {
		/* BUG: rdma-local-mr-management -- the ULP deregisters its MR */
		ib_dereg_mr(buf->mr[lnk->link_idx]); /* OK: rdma-invalidation-leak, rdma-registration-in-datapath -- deregistration kills the key before the pages are unmapped; buffers are unmapped from a link on teardown or a failed first mapping, not per I/O */
		buf->mr[lnk->link_idx] = NULL;
	}
	buf->is_reg_mr[lnk->link_idx] = false;
	if (buf->is_map_ib[lnk->link_idx]) {
		ib_dma_unmap_sg(lnk->smcibdev, buf->sgt[lnk->link_idx].sgl,
				buf->sgt[lnk->link_idx].orig_nents,
				DMA_FROM_DEVICE);
		buf->is_map_ib[lnk->link_idx] = false;
	}
}

int smcb_buf_map_link(struct smcb_buf_desc *buf, struct smcb_link *lnk)
{
	int rc;

	if (buf->is_map_ib[lnk->link_idx])
		return 0;

	rc = ib_dma_map_sg(lnk->smcibdev, buf->sgt[lnk->link_idx].sgl,
			   buf->sgt[lnk->link_idx].orig_nents, DMA_FROM_DEVICE);
	if (!rc)
		return -EIO;
	buf->is_map_ib[lnk->link_idx] = true;

	rc = smcb_get_memory_region(lnk->roce_pd, buf, lnk->link_idx);
	if (rc)
		goto free;

	rc = smcb_wr_reg_send(lnk, buf->mr[lnk->link_idx]);
	if (rc)
		goto free;
	buf->is_reg_mr[lnk->link_idx] = true;
	return 0;

free:
	smcb_buf_unmap_link(buf, lnk);
	return rc;
}

void smcb_fill_rkey(struct smcb_buf_desc *buf, struct smcb_link *lnk,
		    struct smcb_clc_rkey *msg, u64 dma_addr)
{
	msg->rmb_rkey = cpu_to_be32(buf->mr[lnk->link_idx]->rkey);
	msg->rmb_dma_addr = cpu_to_be64(dma_addr);
}
