// SPDX-License-Identifier: GPL-2.0
/*
 * rd_nvmet_inline.c - NVMe-over-RDMA target queue (nvmet-rdma style)
 *
 * Command capsules arrive in receive buffers mapped with ib_dma_map_single()
 * and addressed with the PD's local_dma_lkey; small writes carry their data
 * in-capsule (one inline page per command).  Keyed SGL data is moved with
 * the core rdma_rw API, which chooses MRs and iWARP rights itself.  Two
 * older paths still manage registration by hand: the per-queue controller
 * memory buffer (CMB) that the host may write into directly, and the Get
 * Log Page path, which registers the log buffer for every command.
 *
 * NOT-ANNOTATED: rdma-queue-cap-unchecked, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/unaligned.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define NVMTX_CMD_SIZE		64
#define NVMTX_RSP_SIZE		16
#define NVMTX_MAX_IO_PAGES	256
#define NVMTX_CMB_PAGES		64
#define NVMTX_SMALL_READ	256

struct nvmtx_queue;

struct nvmtx_cmd {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge[2];
	void			*nvme_cmd;
	struct page		*inline_page;
	struct nvmtx_queue	*queue;
};

struct nvmtx_rsp {
	struct list_head	free_list;
	struct nvmtx_queue	*queue;
	struct nvmtx_cmd	*cmd;
	u8			buf[NVMTX_RSP_SIZE];
	struct ib_sge		send_sge;
	struct ib_send_wr	send_wr;
	struct ib_cqe		send_cqe;
	struct ib_cqe		read_cqe;

	struct rdma_rw_ctx	rw;
	struct sg_table		sgt;
	int			n_rdma;
	enum dma_data_direction	dir;

	struct ib_sge		small_sge;
	struct ib_rdma_wr	small_wr;

	struct ib_mr		*log_mr;
	struct scatterlist	log_sg;
	struct ib_reg_wr	log_reg;
	struct ib_rdma_wr	log_wr;
	struct ib_sge		log_sge;
};

struct nvmtx_cmb {
	struct ib_mr		*mr;
	struct scatterlist	sg[NVMTX_CMB_PAGES];
	struct page		*pages[NVMTX_CMB_PAGES];
	int			nents;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct completion	done;
	enum ib_wc_status	status;
	u32			rkey;		/* advertised in the connect response */
};

struct nvmtx_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			port;
	int			size;
	int			inline_data_size;
	struct nvmtx_cmd	*cmds;
	struct nvmtx_rsp	*rsps;
	struct list_head	free_rsps;
	spinlock_t		rsps_lock;
	atomic_t		sq_wr_avail;
	struct nvmtx_cmb	*cmb;
};

static void nvmtx_recv_done(struct ib_cq *cq, struct ib_wc *wc);
void nvmtx_fill_sgl(struct nvmtx_rsp *rsp, struct sg_table *sgt, u32 len);
static void nvmtx_send_done(struct ib_cq *cq, struct ib_wc *wc);
static void nvmtx_read_done(struct ib_cq *cq, struct ib_wc *wc);

static int nvmtx_alloc_cmd(struct nvmtx_queue *q, struct nvmtx_cmd *c)
{
	c->nvme_cmd = kzalloc(NVMTX_CMD_SIZE, GFP_KERNEL);
	if (!c->nvme_cmd)
		return -ENOMEM;
	c->sge[0].addr = ib_dma_map_single(q->dev, c->nvme_cmd, NVMTX_CMD_SIZE, DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(q->dev, c->sge[0].addr))
		goto out_free_cmd;
	c->sge[0].length = NVMTX_CMD_SIZE;
	c->sge[0].lkey = q->pd->local_dma_lkey;	/* OK: rdma-local-mr-management -- receive buffers use the PD's local_dma_lkey */

	c->inline_page = alloc_page(GFP_KERNEL);
	if (!c->inline_page)
		goto out_unmap_cmd;
	c->sge[1].addr = ib_dma_map_single(q->dev, page_address(c->inline_page), PAGE_SIZE,
					   DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(q->dev, c->sge[1].addr))
		goto out_free_page;
	c->sge[1].length = q->inline_data_size;
	c->sge[1].lkey = q->pd->local_dma_lkey;

	c->cqe.done = nvmtx_recv_done;
	c->wr.wr_cqe = &c->cqe;
	c->wr.sg_list = c->sge;
	c->wr.num_sge = 2;
	c->queue = q;
	return 0;

out_free_page:
	__free_page(c->inline_page);
out_unmap_cmd:
	ib_dma_unmap_single(q->dev, c->sge[0].addr, NVMTX_CMD_SIZE, DMA_FROM_DEVICE);
out_free_cmd:
	kfree(c->nvme_cmd);
	return -ENOMEM;
}

static void nvmtx_cmb_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmtx_cmb *cmb = container_of(wc->wr_cqe, struct nvmtx_cmb, reg_cqe);

	cmb->status = wc->status;
	complete(&cmb->done);
}

static void nvmtx_cmb_free_pages(struct nvmtx_queue *q, struct nvmtx_cmb *cmb)
{
	int i;

	ib_dma_unmap_sg(q->dev, cmb->sg, NVMTX_CMB_PAGES, DMA_BIDIRECTIONAL);
	for (i = 0; i < NVMTX_CMB_PAGES; i++)
		if (cmb->pages[i])
			__free_page(cmb->pages[i]);
	memset(cmb->pages, 0, sizeof(cmb->pages));
	cmb->nents = 0;
}

static int nvmtx_cmb_init(struct nvmtx_queue *q)
{
	struct nvmtx_cmb *cmb;
	int i, n, ret = -ENOMEM;

	cmb = kzalloc(sizeof(*cmb), GFP_KERNEL);
	if (!cmb)
		return -ENOMEM;
	sg_init_table(cmb->sg, NVMTX_CMB_PAGES);
	for (i = 0; i < NVMTX_CMB_PAGES; i++) {
		cmb->pages[i] = alloc_page(GFP_KERNEL);
		if (!cmb->pages[i])
			goto out_free_pages;
		sg_set_page(&cmb->sg[i], cmb->pages[i], PAGE_SIZE, 0);
	}

	cmb->mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, NVMTX_CMB_PAGES); /* BUG: rdma-local-mr-management -- ULP allocates its own MR for the CMB */ /* OK: rdma-registration-in-datapath -- once per queue at setup */
	if (IS_ERR(cmb->mr)) {
		ret = PTR_ERR(cmb->mr);
		goto out_free_pages;
	}
	cmb->nents = ib_dma_map_sg(q->dev, cmb->sg, NVMTX_CMB_PAGES, DMA_BIDIRECTIONAL);
	if (!cmb->nents)
		goto out_dereg;
	n = ib_map_mr_sg(cmb->mr, cmb->sg, cmb->nents, NULL, PAGE_SIZE); /* BUG: rdma-local-mr-management -- ULP maps its own MR */
	if (n < cmb->nents) {
		ret = -EINVAL;
		goto out_unmap;	/* BUG: rdma-mr-leak -- jumps past out_dereg, the CMB MR is never released */
	}

	init_completion(&cmb->done);
	cmb->reg_cqe.done = nvmtx_cmb_reg_done;
	ib_update_fast_reg_key(cmb->mr, ib_inc_rkey(cmb->mr->rkey));
	cmb->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- ULP posts its own REG_MR to expose the CMB */
	cmb->reg_wr.wr.wr_cqe = &cmb->reg_cqe;
	cmb->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmb->reg_wr.mr = cmb->mr;
	cmb->reg_wr.key = cmb->mr->rkey;
	cmb->reg_wr.access = IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ; /* BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE, the REG_MR fails */
	ret = ib_post_send(q->qp, &cmb->reg_wr.wr, NULL);
	if (ret)
		goto out_dereg_unmap;
	wait_for_completion(&cmb->done);
	if (cmb->status != IB_WC_SUCCESS) {
		ret = -EIO;
		goto out_dereg_unmap;
	}
	cmb->rkey = cmb->mr->rkey;
	q->cmb = cmb;
	return 0;

out_dereg_unmap:
	ib_dereg_mr(cmb->mr);	/* BUG: rdma-local-mr-management -- ULP deregisters its own MR (annotated in triage: the author marked every other ib_dereg_mr of the file) */
	ib_dma_unmap_sg(q->dev, cmb->sg, NVMTX_CMB_PAGES, DMA_BIDIRECTIONAL);	/* OK: rdma-invalidation-leak -- deregistered first */
	goto out_free_pages;
out_unmap:
	ib_dma_unmap_sg(q->dev, cmb->sg, NVMTX_CMB_PAGES, DMA_BIDIRECTIONAL);
	goto out_free_pages;
out_dereg:
	ib_dereg_mr(cmb->mr);	/* BUG: rdma-local-mr-management -- ULP deregisters its own MR (annotated in triage) */
out_free_pages:
	for (i = 0; i < NVMTX_CMB_PAGES; i++)
		if (cmb->pages[i])
			__free_page(cmb->pages[i]);
	kfree(cmb);
	return ret;
}

/* Memory pressure: give the CMB pages back, keep the MR for later. */
void nvmtx_cmb_shrink(struct nvmtx_queue *q)
{
	struct nvmtx_cmb *cmb = q->cmb;

	if (!cmb || !cmb->nents)
		return;
	nvmtx_cmb_free_pages(q, cmb);	/* BUG: rdma-invalidation-leak -- the host still holds cmb->rkey; no LOCAL_INV before the pages go back to the allocator */
}

static int nvmtx_map_keyed(struct nvmtx_rsp *rsp, u64 addr, u32 len, u32 key,
			   enum dma_data_direction dir)
{
	struct nvmtx_queue *q = rsp->queue;
	int ret;

	ret = sg_alloc_table(&rsp->sgt, DIV_ROUND_UP(len, PAGE_SIZE), GFP_ATOMIC);
	if (ret)
		return ret;
	nvmtx_fill_sgl(rsp, &rsp->sgt, len);	/* pages from the backing store */
	rsp->dir = dir;
	ret = rdma_rw_ctx_init(&rsp->rw, q->qp, q->port, rsp->sgt.sgl, rsp->sgt.nents, 0,
			       addr, key, dir); /* OK: rdma-local-mr-management -- the core rdma_rw API manages registration */ /* OK: rdma-access-flags-transport -- rdma_rw gives iWARP READ sinks their rights */
	if (ret < 0) {
		sg_free_table(&rsp->sgt);
		return ret;
	}
	rsp->n_rdma = ret;
	return 0;
}

/* Tiny keyed writes: pull the data straight into the inline page. */
static int nvmtx_read_small(struct nvmtx_rsp *rsp, u64 addr, u32 len, u32 key)
{
	struct nvmtx_queue *q = rsp->queue;

	rsp->small_sge.addr = rsp->cmd->sge[1].addr;
	rsp->small_sge.length = len;
	rsp->small_sge.lkey = q->pd->local_dma_lkey;	/* OK: rdma-local-mr-management -- local_dma_lkey, no MR */
	memset(&rsp->small_wr, 0, sizeof(rsp->small_wr));
	rsp->small_wr.wr.opcode = IB_WR_RDMA_READ;
	rsp->small_wr.wr.sg_list = &rsp->small_sge;
	rsp->small_wr.wr.num_sge = 1;
	rsp->small_wr.wr.wr_cqe = &rsp->read_cqe;
	rsp->small_wr.wr.send_flags = IB_SEND_SIGNALED;
	rsp->small_wr.remote_addr = addr;
	rsp->small_wr.rkey = key;
	return ib_post_send(q->qp, &rsp->small_wr.wr, NULL); /* BUG: rdma-access-flags-transport -- READ sink addressed with local_dma_lkey cannot take an iWARP read response */
}

static int nvmtx_get_log(struct nvmtx_rsp *rsp, void *log, u32 len, u64 addr, u32 key)
{
	struct nvmtx_queue *q = rsp->queue;
	int n;

	rsp->log_mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, DIV_ROUND_UP(len, PAGE_SIZE) + 1); /* BUG: rdma-registration-in-datapath -- an MR allocated for every Get Log Page command */ /* BUG: rdma-local-mr-management -- ULP-managed MR for an RDMA WRITE source */
	if (IS_ERR(rsp->log_mr)) {
		rsp->log_mr = NULL;
		return -ENOMEM;
	}
	sg_init_one(&rsp->log_sg, log, len);
	if (!ib_dma_map_sg(q->dev, &rsp->log_sg, 1, DMA_TO_DEVICE))
		goto out_dereg;
	n = ib_map_mr_sg(rsp->log_mr, &rsp->log_sg, 1, NULL, PAGE_SIZE); /* BUG: rdma-local-mr-management -- ULP maps its own MR */
	if (n < 1)
		return -EINVAL;	/* BUG: rdma-mr-leak -- rsp->log_mr is neither released nor unmapped on this error return */

	memset(&rsp->log_reg, 0, sizeof(rsp->log_reg));
	rsp->log_reg.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- ULP posts its own REG_MR */
	rsp->log_reg.wr.next = &rsp->log_wr.wr;
	rsp->log_reg.mr = rsp->log_mr;
	rsp->log_reg.key = rsp->log_mr->rkey;
	rsp->log_reg.access = IB_ACCESS_LOCAL_WRITE;	/* OK: rdma-access-flags-invalid -- local access only */

	rsp->log_sge.addr = rsp->log_mr->iova;
	rsp->log_sge.length = len;
	rsp->log_sge.lkey = rsp->log_mr->lkey;
	memset(&rsp->log_wr, 0, sizeof(rsp->log_wr));
	rsp->log_wr.wr.opcode = IB_WR_RDMA_WRITE;
	rsp->log_wr.wr.sg_list = &rsp->log_sge;
	rsp->log_wr.wr.num_sge = 1;
	rsp->log_wr.wr.next = &rsp->send_wr;
	rsp->log_wr.remote_addr = addr;
	rsp->log_wr.rkey = key;
	return ib_post_send(q->qp, &rsp->log_reg.wr, NULL);

out_dereg:
	ib_dereg_mr(rsp->log_mr);	/* OK: rdma-mr-leak -- the DMA-mapping failure releases the MR */ /* BUG: rdma-local-mr-management -- ULP deregisters its own MR (annotated in triage) */
	rsp->log_mr = NULL;
	return -EIO;
}

static void nvmtx_release_rsp(struct nvmtx_rsp *rsp)
{
	struct nvmtx_queue *q = rsp->queue;
	unsigned long flags;

	if (rsp->n_rdma) {
		rdma_rw_ctx_destroy(&rsp->rw, q->qp, q->port, rsp->sgt.sgl, rsp->sgt.nents,
				    rsp->dir); /* OK: rdma-invalidation-leak -- rdma_rw owns its MRs and invalidates them on reuse */ /* OK: rdma-local-mr-management -- core API */
		sg_free_table(&rsp->sgt);
		rsp->n_rdma = 0;
	}
	spin_lock_irqsave(&q->rsps_lock, flags);
	list_add_tail(&rsp->free_list, &q->free_rsps);
	spin_unlock_irqrestore(&q->rsps_lock, flags);
}

static void nvmtx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmtx_rsp *rsp = container_of(wc->wr_cqe, struct nvmtx_rsp, send_cqe);
	struct nvmtx_queue *q = rsp->queue;

	if (rsp->log_mr) {
		ib_dma_unmap_sg(q->dev, &rsp->log_sg, 1, DMA_TO_DEVICE);	/* OK: rdma-invalidation-leak -- the log MR was registered for local access only, no key reached the host */
		ib_dereg_mr(rsp->log_mr);	/* BUG: rdma-registration-in-datapath -- deregistration per command completion */ /* BUG: rdma-local-mr-management -- ULP deregisters its own MR */ /* OK: rdma-mr-leak -- released before the rsp is recycled */
		rsp->log_mr = NULL;
	}
	atomic_inc(&q->sq_wr_avail);
	nvmtx_release_rsp(rsp);
}

static void nvmtx_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmtx_rsp *rsp = container_of(wc->wr_cqe, struct nvmtx_rsp, read_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		nvmtx_release_rsp(rsp);
		return;
	}
	/* data is in place: hand the command to the block layer (elided) */
}

static void nvmtx_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmtx_cmd *c = container_of(wc->wr_cqe, struct nvmtx_cmd, cqe);
	struct nvmtx_queue *q = c->queue;
	struct nvmtx_rsp *rsp;
	u8 *sqe = c->nvme_cmd;
	u64 addr = get_unaligned_le64(sqe + 24);
	u32 len = get_unaligned_le32(sqe + 32) & 0xffffff;
	u32 key = get_unaligned_le32(sqe + 36);
	unsigned long flags;

	if (wc->status != IB_WC_SUCCESS)
		return;
	spin_lock_irqsave(&q->rsps_lock, flags);
	rsp = list_first_entry_or_null(&q->free_rsps, struct nvmtx_rsp, free_list);
	if (rsp)
		list_del(&rsp->free_list);
	spin_unlock_irqrestore(&q->rsps_lock, flags);
	if (!rsp)
		return;
	rsp->cmd = c;

	if (sqe[0] == 0x02 /* get log page */) {
		if (nvmtx_get_log(rsp, page_address(c->inline_page), len, addr, key))
			nvmtx_release_rsp(rsp);
	} else if (sqe[0] == 0x01 /* write */ && len <= NVMTX_SMALL_READ) {
		if (nvmtx_read_small(rsp, addr, len, key))
			nvmtx_release_rsp(rsp);
	} else if (sqe[0] == 0x01) {
		if (nvmtx_map_keyed(rsp, addr, len, key, DMA_FROM_DEVICE) ||
		    rdma_rw_ctx_post(&rsp->rw, q->qp, q->port, &rsp->read_cqe, NULL))
			nvmtx_release_rsp(rsp);
	}
}

int nvmtx_create_queue(struct nvmtx_queue *q)
{
	struct ib_qp_init_attr qp_attr = { };
	int i, ret;

	q->inline_data_size = PAGE_SIZE;
	if (rdma_protocol_iwarp(q->dev, q->port))	/* OK: rdma-access-flags-transport -- inline sizing, not access flags */
		q->inline_data_size = min_t(int, PAGE_SIZE, q->dev->attrs.max_sge_rd * 512);

	q->cq = ib_alloc_cq(q->dev, q, 3 * q->size, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(q->cq))
		return PTR_ERR(q->cq);
	qp_attr.send_cq = q->cq;
	qp_attr.recv_cq = q->cq;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.port_num = q->port;
	qp_attr.cap.max_send_wr = q->size;
	qp_attr.cap.max_rdma_ctxs = q->size * rdma_rw_mr_factor(q->dev, q->port, NVMTX_MAX_IO_PAGES);
	qp_attr.cap.max_send_sge = max_t(int, q->dev->attrs.max_send_sge, 1);
	qp_attr.cap.max_recv_wr = q->size;
	qp_attr.cap.max_recv_sge = 2;
	ret = rdma_create_qp(q->cm_id, q->pd, &qp_attr);
	if (ret)
		goto out_free_cq;
	q->qp = q->cm_id->qp;

	q->cmds = kcalloc(q->size, sizeof(*q->cmds), GFP_KERNEL);
	q->rsps = kcalloc(q->size, sizeof(*q->rsps), GFP_KERNEL);
	if (!q->cmds || !q->rsps)
		goto out_destroy_qp;
	INIT_LIST_HEAD(&q->free_rsps);
	spin_lock_init(&q->rsps_lock);
	for (i = 0; i < q->size; i++) {
		struct nvmtx_rsp *rsp = &q->rsps[i];

		rsp->queue = q;
		rsp->send_cqe.done = nvmtx_send_done;
		rsp->read_cqe.done = nvmtx_read_done;
		rsp->send_sge.addr = ib_dma_map_single(q->dev, rsp->buf, NVMTX_RSP_SIZE, DMA_TO_DEVICE);
		rsp->send_sge.length = NVMTX_RSP_SIZE;
		rsp->send_sge.lkey = q->pd->local_dma_lkey;
		rsp->send_wr.opcode = IB_WR_SEND;
		rsp->send_wr.sg_list = &rsp->send_sge;
		rsp->send_wr.num_sge = 1;
		rsp->send_wr.wr_cqe = &rsp->send_cqe;
		rsp->send_wr.send_flags = IB_SEND_SIGNALED;
		list_add_tail(&rsp->free_list, &q->free_rsps);
		if (nvmtx_alloc_cmd(q, &q->cmds[i]))
			goto out_destroy_qp;
		ib_post_recv(q->qp, &q->cmds[i].wr, NULL);
	}
	atomic_set(&q->sq_wr_avail, qp_attr.cap.max_send_wr);
	return nvmtx_cmb_init(q);

out_destroy_qp:
	kfree(q->cmds);
	kfree(q->rsps);
	rdma_destroy_qp(q->cm_id);
out_free_cq:
	ib_free_cq(q->cq);
	return -ENOMEM;
}

void nvmtx_destroy_queue(struct nvmtx_queue *q)
{
	ib_drain_qp(q->qp);
	if (q->cmb) {
		ib_dereg_mr(q->cmb->mr);	/* BUG: rdma-local-mr-management -- ULP deregisters its own MR */ /* OK: rdma-registration-in-datapath -- queue teardown */
		if (q->cmb->nents)
			nvmtx_cmb_free_pages(q, q->cmb);	/* OK: rdma-invalidation-leak -- ib_dereg_mr above killed the CMB key */
		kfree(q->cmb);
	}
	rdma_destroy_qp(q->cm_id);
	ib_free_cq(q->cq);
	kfree(q->rsps);
	kfree(q->cmds);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("NVMe-over-RDMA target queue, inline data and CMB");
