// SPDX-License-Identifier: GPL-2.0
/*
 * nvh io.c: the I/O path (see nvmeh.h).
 *
 * Two bugs. nvh_map_data() registers the pooled MR without rotating its key,
 * so an MR that comes back from the pool is registered with the rkey the
 * controller saw for the previous command. And when the controller did not
 * invalidate remotely, nvh_process_rsp() posts an unsignaled LOCAL_INV "to
 * save a completion" and ends the request at once, which unmaps the pages
 * and returns the MR to the pool before the LOCAL_INV has executed. The
 * remote invalidation itself is compared with the request's key, and the
 * short-map path puts the MR back.
 */
#include "nvmeh.h"

static void nvh_unmap_data(struct nvh_request *req)
{
	struct nvh_queue *queue = req->queue;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the host returns MRs to its own pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->device->dev, req->sgt.sgl, req->nents, req->dir);
	req->nents = 0;
}

static void nvh_end_request(struct nvh_request *req)
{
	nvh_unmap_data(req);
	blk_mq_end_request(blk_mq_rq_from_pdu(req),
			   req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void nvh_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvh_request *req = container_of(wc->wr_cqe, struct nvh_request,
					       send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvh_error_recovery(req->queue->ctrl);
		return;
	}
	if (atomic_dec_and_test(&req->ref))
		nvh_end_request(req);
}

int nvh_map_data(struct nvh_queue *queue, struct nvh_request *req)
{
	int count, nr;

	count = ib_dma_map_sg(queue->device->dev, req->sgt.sgl, req->sgt.nents,
			      req->dir);
	if (unlikely(count <= 0))
		return -EIO;
	req->nents = req->sgt.nents;

	/* BUG: rdma-local-mr-management -- per-command MR from the host's own pool */
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr)) {
		nvh_unmap_data(req);
		return -EAGAIN;
	}
	/* BUG: rdma-local-mr-management -- the host maps pages into its MR */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		nvh_unmap_data(req); /* OK: rdma-mr-leak -- the helper puts the MR back */
		return nr < 0 ? nr : -EINVAL;
	}

	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the host */
	req->reg_wr.wr.next = &req->send_wr;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = req->mr; /* BUG: rdma-rkey-reuse -- a pooled MR is registered again without ib_update_fast_reg_key() */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;
	put_unaligned_le32(req->mr->rkey, req->sgl_key);
	return 0;
}

int nvh_queue_rq(struct nvh_queue *queue, struct nvh_request *req)
{
	int err;

	req->queue = queue;
	atomic_set(&req->ref, 2);
	err = nvh_map_data(queue, req);
	if (err)
		return err;

	req->send_sge.addr = req->cmd_dma;
	req->send_sge.length = 64;
	req->send_sge.lkey = queue->device->pd->local_dma_lkey;
	req->send_cqe.done = nvh_send_done;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	err = ib_post_send(queue->qp, &req->reg_wr.wr, NULL);
	if (err)
		nvh_unmap_data(req); /* OK: rdma-invalidation-leak -- the chain was not posted */
	return err;
}

static void nvh_inv_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvh_request *req = container_of(wc->wr_cqe, struct nvh_request,
					       reg_cqe);

	if (wc->status != IB_WC_SUCCESS)
		nvh_error_recovery(req->queue->ctrl);
}

void nvh_process_rsp(struct nvh_queue *queue, u16 tag, u16 status,
		     struct ib_wc *wc)
{
	struct nvh_request *req = nvh_tag_to_req(queue, tag);
	struct ib_send_wr inv_wr = { };

	req->status = status;
	/* OK: rdma-remote-invalidate-unchecked -- a mismatching invalidated rkey starts error recovery */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(wc->ex.invalidate_rkey != req->mr->rkey)) {
			nvh_error_recovery(queue->ctrl);
			return;
		}
	} else if (req->mr) {
		inv_wr.opcode = IB_WR_LOCAL_INV;
		inv_wr.send_flags = 0;	/* save a completion */
		inv_wr.ex.invalidate_rkey = req->mr->rkey;
		req->reg_cqe.done = nvh_inv_err_done;
		inv_wr.wr_cqe = &req->reg_cqe;
		if (ib_post_send(queue->qp, &inv_wr, NULL)) {
			nvh_error_recovery(queue->ctrl);
			return;
		}
	}
	if (atomic_dec_and_test(&req->ref))
		nvh_end_request(req); /* BUG: rdma-unmap-before-invalidate -- the pages are unmapped and the MR pooled right after an unsignaled LOCAL_INV nobody waits for */
}
