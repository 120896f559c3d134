// SPDX-License-Identifier: GPL-2.0
/*
 * rc_nvmf_host.c - NVMe over Fabrics RDMA host transport (nvme-rdma style).
 *
 * Queue 0 is the admin queue, queues 1..n carry I/O; each is an RC QP
 * created through rdma_cm.  A command with data maps its scatterlist into
 * a fast-registration MR, posts IB_WR_REG_MR chained in front of the
 * command SEND and describes the buffer to the controller with a keyed SGL
 * holding the MR's rkey.  When the response arrives the MR is dead only if
 * the controller invalidated it (SEND_WITH_INV, compared with our rkey);
 * otherwise we post a LOCAL_INV and complete the request from its
 * completion.  I/O queues take their MRs from the QP's MR pool; admin
 * commands (identify, log pages) map their small buffers through one MR
 * that the admin queue keeps for its lifetime, one data command at a
 * time.  Every SEND is signaled.
 *
 * With register_always=N, single-segment I/O skips registration and uses
 * the PD's global rkey, as nvme-rdma once did.
 *
 * Wrong here: the send queue has room for exactly MR, SEND and INV per
 * slot and none for the drain at teardown (the receive queue has it); the
 * admin MR is re-registered for every command under the same key; the PD
 * may be allocated with IB_PD_UNSAFE_GLOBAL_RKEY.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-invalidate-unchecked, rdma-unmap-before-invalidate -- not reviewed for this driver
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/kernel.h>
#include <linux/printk.h>
#include <linux/unaligned.h>
#include <linux/blk-mq.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define NVMF_MAX_INLINE_SEGS		4
#define NVMF_MAX_PAGES_PER_MR		128
#define NVMF_ADMIN_MAX_PAGES		16
#define NVME_KEY_SGL_FMT_DATA_DESC	0x4
#define NVME_SGL_FMT_INVALIDATE		0xf

static bool register_always = true;
module_param(register_always, bool, 0444);
MODULE_PARM_DESC(register_always, "Use memory registration even for contiguous memory regions");

struct nvmf_keyed_sgl { __le64 addr; u8 length[3]; u8 key[4]; u8 type; };

struct nvmf_command {
	u8 opcode, flags; u16 command_id; __le32 nsid; __le64 rsvd2[2];
	struct nvmf_keyed_sgl dptr; __le32 cdw[6];
};

struct nvmf_completion { __le32 result, rsvd; __le16 sq_head, sq_id; u16 command_id; __le16 status; };
struct nvmf_queue;

struct nvmf_qe {
	void			*data;
	u64			dma;
	struct ib_cqe		cqe;
	struct nvmf_queue	*queue;
};

struct nvmf_request {
	struct nvmf_qe		sqe;
	struct ib_sge		sge[1 + NVMF_MAX_INLINE_SEGS];
	u32			num_sge;
	struct ib_mr		*mr;		/* pooled, I/O queues */
	bool			admin_mr;	/* mapped through queue->admin_mr */
	bool			need_inval;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct sg_table		sgt;
	int			nents;
	__le16			status;
	struct request		*rq;
};

struct nvmf_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			num_inline_segments;
};

struct nvmf_queue {
	struct nvmf_device	*device;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	int			cq_size;
	int			idx;
	u32			queue_size;
	struct nvmf_qe		*rsp_ring;
	struct nvmf_request	*reqs;
	struct ib_mr		*admin_mr;
	bool			admin_mr_busy;
	struct ib_reg_wr	admin_reg_wr;
	struct ib_send_wr	admin_inv_wr;
};

void nvmf_error_recovery(struct nvmf_queue *queue);
static void nvmf_recv_done(struct ib_cq *cq, struct ib_wc *wc);

int nvmf_device_init(struct nvmf_device *ndev, struct ib_device *dev)
{
	ndev->dev = dev;
	ndev->pd = ib_alloc_pd(dev, register_always ? 0 : IB_PD_UNSAFE_GLOBAL_RKEY); // BUG: rdma-remote-access-overbroad -- with register_always=N every peer that learns the global rkey can read and write all of memory
	if (IS_ERR(ndev->pd))
		return PTR_ERR(ndev->pd);
	ndev->num_inline_segments = min(NVMF_MAX_INLINE_SEGS,
					dev->attrs.max_send_sge - 1);
	return 0;
}

static int nvmf_create_qp(struct nvmf_queue *queue, const int factor)
{
	struct nvmf_device *dev = queue->device;
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_context = queue;
	/* BUG(file): rdma-send-queue-undersized -- exactly three WRs per slot and no spare entry, yet nvmf_stop_and_free_queue() calls ib_drain_qp() */
	init_attr.cap.max_send_wr = factor * queue->queue_size; // BUG: rdma-send-queue-manual-factor -- the depth is multiplied by a hand-made factor for the REG_MR and LOCAL_INV work requests
	init_attr.cap.max_recv_wr = queue->queue_size + 1; // OK: rdma-send-queue-undersized -- one receive per slot plus one for ib_drain_qp()
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + dev->num_inline_segments; // OK: rdma-queue-cap-unchecked -- derived from attrs.max_send_sge in nvmf_device_init()
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;

	ret = rdma_create_qp(queue->cm_id, dev->pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

static int nvmf_post_recv(struct nvmf_queue *queue, struct nvmf_qe *qe)
{
	struct ib_sge sge = {
		.addr = qe->dma,
		.length = sizeof(struct nvmf_completion),
		.lkey = queue->device->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = { .wr_cqe = &qe->cqe, .sg_list = &sge, .num_sge = 1 };

	qe->cqe.done = nvmf_recv_done;
	qe->queue = queue;
	return ib_post_recv(queue->qp, &wr, NULL);
}

int nvmf_create_queue_ib(struct nvmf_queue *queue)
{
	struct ib_device *ibdev = queue->device->dev;
	const int send_wr_factor = 3;	/* MR, SEND, INV */
	int ret, i;

	queue->cq_size = send_wr_factor * queue->queue_size + queue->queue_size + 1;
	queue->ib_cq = ib_alloc_cq(ibdev, queue, queue->cq_size, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->ib_cq))
		return PTR_ERR(queue->ib_cq);

	ret = nvmf_create_qp(queue, send_wr_factor);
	if (ret)
		goto out_free_cq;

	if (queue->idx == 0) {
		queue->admin_mr = ib_alloc_mr(queue->device->pd, IB_MR_TYPE_MEM_REG,
					      NVMF_ADMIN_MAX_PAGES);
		ret = IS_ERR(queue->admin_mr) ? PTR_ERR(queue->admin_mr) : 0;
	} else {
		ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->queue_size,
				      IB_MR_TYPE_MEM_REG, NVMF_MAX_PAGES_PER_MR, 0);
	}
	if (ret)
		goto out_destroy_qp;

	for (i = 0; i < queue->queue_size; i++) {
		ret = nvmf_post_recv(queue, &queue->rsp_ring[i]);
		if (ret)
			goto out_destroy_mrs;
	}
	return 0;

out_destroy_mrs:
	if (queue->idx == 0)
		ib_dereg_mr(queue->admin_mr);
	else
		ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_free_cq:
	ib_free_cq(queue->ib_cq);
	return ret;
}

void nvmf_stop_and_free_queue(struct nvmf_queue *queue)
{
	rdma_disconnect(queue->cm_id);
	ib_drain_qp(queue->qp);
	if (queue->idx == 0)
		ib_dereg_mr(queue->admin_mr);
	else
		ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_free_cq(queue->ib_cq);
}

static void nvmf_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("nvmf: MEMREG failed: %s\n", ib_wc_status_msg(wc->status));
}

static void nvmf_set_keyed_sgl(struct nvmf_command *c, u64 addr, u32 len, u32 rkey)
{
	struct nvmf_keyed_sgl *sg = &c->dptr;

	sg->addr = cpu_to_le64(addr);
	put_unaligned_le24(len, sg->length);
	put_unaligned_le32(rkey, sg->key);
	sg->type = (NVME_KEY_SGL_FMT_DATA_DESC << 4) | NVME_SGL_FMT_INVALIDATE;
}

static int nvmf_map_sg_fr(struct nvmf_queue *queue, struct nvmf_request *req,
			  struct nvmf_command *c, int count)
{
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return nr < 0 ? nr : -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = nvmf_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr; // OK: rdma-rkey-reuse -- the pooled MR's key was rotated just above
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE; // OK: rdma-remote-access-overbroad -- the rkey goes to the controller in the keyed SGL
	nvmf_set_keyed_sgl(c, req->mr->iova, req->mr->length, req->mr->rkey);
	req->need_inval = true;
	return 0;
}

static int nvmf_map_admin(struct nvmf_queue *queue, struct nvmf_request *req,
			  struct nvmf_command *c, int count)
{
	struct ib_mr *mr = queue->admin_mr;
	int nr;

	if (queue->admin_mr_busy)
		return -EBUSY;		/* requeued by the block layer */
	nr = ib_map_mr_sg(mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count))
		return nr < 0 ? nr : -EINVAL;
	queue->admin_mr_busy = true;

	req->reg_cqe.done = nvmf_memreg_done;
	memset(&queue->admin_reg_wr, 0, sizeof(queue->admin_reg_wr));
	queue->admin_reg_wr.wr.opcode = IB_WR_REG_MR;
	queue->admin_reg_wr.wr.wr_cqe = &req->reg_cqe;
	queue->admin_reg_wr.mr = mr; // BUG: rdma-rkey-reuse -- the admin MR is registered again for every command after its LOCAL_INV, always under the same key
	queue->admin_reg_wr.key = mr->rkey;
	queue->admin_reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
				     IB_ACCESS_REMOTE_WRITE; // OK: rdma-remote-access-overbroad -- the admin MR's rkey is put in the keyed SGL too
	nvmf_set_keyed_sgl(c, mr->iova, mr->length, mr->rkey);
	req->admin_mr = true;
	req->need_inval = true;
	return 0;
}

static int nvmf_map_data(struct nvmf_queue *queue, struct nvmf_request *req,
			 struct nvmf_command *c)
{
	struct nvmf_keyed_sgl *sg = &c->dptr;
	int count;

	req->num_sge = 1;
	req->mr = NULL;
	req->admin_mr = false;
	req->need_inval = false;
	if (!blk_rq_nr_phys_segments(req->rq))
		return 0;
	req->sgt.sgl = (struct scatterlist *)(req + 1);
	req->nents = blk_rq_map_sg(NULL, req->rq, req->sgt.sgl);
	count = ib_dma_map_sg(queue->device->dev, req->sgt.sgl, req->nents,
			      rq_data_dir(req->rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	if (unlikely(count <= 0))
		return -EIO;

	if (queue->idx == 0)
		return nvmf_map_admin(queue, req, c, count);
	if (count == 1 && !register_always) {
		sg->addr = cpu_to_le64(sg_dma_address(req->sgt.sgl));
		put_unaligned_le24(sg_dma_len(req->sgt.sgl), sg->length);
		put_unaligned_le32(queue->device->pd->unsafe_global_rkey, sg->key);
		sg->type = NVME_KEY_SGL_FMT_DATA_DESC << 4;
		return 0;
	}
	return nvmf_map_sg_fr(queue, req, c, count);
}

static int nvmf_post_send(struct nvmf_queue *queue, struct nvmf_qe *qe,
			  struct ib_sge *sge, u32 num_sge, struct ib_send_wr *first)
{
	struct ib_send_wr wr;
	int ret;

	sge->addr = qe->dma;
	sge->length = sizeof(struct nvmf_command);
	sge->lkey = queue->device->pd->local_dma_lkey;

	wr.next = NULL;
	wr.wr_cqe = &qe->cqe;
	wr.sg_list = sge;
	wr.num_sge = num_sge;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED; // OK: rdma-unsignaled-send-starvation -- every command SEND asks for its completion

	if (first)
		first->next = &wr;
	else
		first = &wr;
	ret = ib_post_send(queue->qp, first, NULL);
	if (unlikely(ret))
		pr_err("nvmf: ib_post_send failed: %d\n", ret);
	return ret;
}

int nvmf_queue_rq(struct nvmf_queue *queue, struct nvmf_request *req)
{
	struct nvmf_command *c = req->sqe.data;
	struct ib_send_wr *first = NULL;
	int ret;

	ret = nvmf_map_data(queue, req, c);
	if (ret)
		return ret;
	if (req->admin_mr)
		first = &queue->admin_reg_wr.wr;
	else if (req->mr)
		first = &req->reg_wr.wr;
	return nvmf_post_send(queue, &req->sqe, req->sge, req->num_sge, first);
}

static void nvmf_end_request(struct nvmf_queue *queue, struct nvmf_request *req)
{
	if (req->nents)
		ib_dma_unmap_sg(queue->device->dev, req->sgt.sgl, req->nents,
				rq_data_dir(req->rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	if (req->mr) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	if (req->admin_mr)
		queue->admin_mr_busy = false;
	blk_mq_complete_request(req->rq);
}

static void nvmf_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmf_request *req = container_of(wc->wr_cqe, struct nvmf_request, inv_cqe);
	struct nvmf_queue *queue = req->sqe.queue;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("nvmf: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		nvmf_error_recovery(queue);
		return;
	}
	nvmf_end_request(queue, req);
}

static int nvmf_inv_rkey(struct nvmf_queue *queue, struct nvmf_request *req)
{
	struct ib_send_wr *wr = req->admin_mr ? &queue->admin_inv_wr : &req->inv_wr;

	req->inv_cqe.done = nvmf_inv_rkey_done;
	memset(wr, 0, sizeof(*wr));
	wr->opcode = IB_WR_LOCAL_INV;
	wr->send_flags = IB_SEND_SIGNALED;
	wr->wr_cqe = &req->inv_cqe;
	wr->ex.invalidate_rkey = req->admin_mr ? queue->admin_mr->rkey : req->mr->rkey;
	return ib_post_send(queue->qp, wr, NULL);
}

static void nvmf_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvmf_qe *qe = container_of(wc->wr_cqe, struct nvmf_qe, cqe);
	struct nvmf_queue *queue = qe->queue;
	struct nvmf_completion *cqe = qe->data;
	struct nvmf_request *req;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvmf_error_recovery(queue);
		return;
	}
	ib_dma_sync_single_for_cpu(queue->device->dev, qe->dma, sizeof(*cqe),
				   DMA_FROM_DEVICE);
	req = &queue->reqs[cqe->command_id % queue->queue_size];
	req->status = cqe->status;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		u32 rkey = req->admin_mr ? queue->admin_mr->rkey : req->mr->rkey;

		if (unlikely(!req->need_inval || wc->ex.invalidate_rkey != rkey)) {
			pr_err("nvmf: bogus remote invalidation for rkey %#x\n",
			       wc->ex.invalidate_rkey);
			nvmf_error_recovery(queue);
			return;
		}
		req->need_inval = false;
	} else if (req->need_inval) {
		if (nvmf_inv_rkey(queue, req))
			nvmf_error_recovery(queue);
		goto repost;	/* completes from nvmf_inv_rkey_done() */
	}
	nvmf_end_request(queue, req);
repost:
	ib_dma_sync_single_for_device(queue->device->dev, qe->dma, sizeof(*cqe),
				      DMA_FROM_DEVICE);
	nvmf_post_recv(queue, qe);
}

MODULE_DESCRIPTION("NVMe-oF RDMA host transport (sketch)");
MODULE_LICENSE("GPL");
