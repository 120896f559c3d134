// SPDX-License-Identifier: GPL-2.0
/*
 * nbx: request abort handling of an invented network-block-device client
 * over RDMA ("nbx"). Each request registers its pages (pool MR, rotated key,
 * remote rights for the server) and sends the command. When the block layer
 * aborts a request:
 *
 *   - if the command was never posted, the MR is put back and the request
 *     freed (nothing was exposed);
 *   - if it was posted, nbx_abort_posted() is supposed to invalidate the key
 *     and free the request from the LOCAL_INV's completion, but it frees the
 *     request at once, and with it the only reference to an MR whose key the
 *     server still holds.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct nbx_queue {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
};

struct nbx_req {
	struct nbx_queue	*q;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct scatterlist	*sgl;
	int			nents;
	bool			posted;
	u8			key[4];
};

int nbx_queue_rq(struct nbx_req *req)
{
	struct nbx_queue *q = req->q;
	int ret;

	/* BUG: rdma-local-mr-management -- per-request MR from the client's own pool */
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the client maps pages into its MR */
	if (ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K) != req->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	req->reg_wr.wr.next = &req->send_wr;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			     IB_ACCESS_REMOTE_READ;
	put_unaligned_le32(req->mr->rkey, req->key);

	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;
	req->send_wr.next = NULL;
	ret = ib_post_send(q->qp, &req->reg_wr.wr, NULL);
	if (!ret)
		req->posted = true;
	return ret;
}

void nbx_abort_unposted(struct nbx_req *req)
{
	struct nbx_queue *q = req->q;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- never posted, the server never saw this key */
		req->mr = NULL;
	}
	ib_dma_unmap_sg(q->ibdev, req->sgl, req->nents, DMA_BIDIRECTIONAL);
	kfree(req); /* OK: rdma-mr-leak -- the MR was put back first */
}

void nbx_abort_posted(struct nbx_req *req)
{
	struct nbx_queue *q = req->q;

	pr_warn("nbx: aborting request with rkey %#x\n", req->mr->rkey);
	/* BUG: rdma-invalidation-leak -- the pages are unmapped while the server still holds a valid rkey for them */
	ib_dma_unmap_sg(q->ibdev, req->sgl, req->nents, DMA_BIDIRECTIONAL);
	kfree(req); /* BUG: rdma-mr-leak -- the request is freed together with its pool MR */
}
