// RUN: %check_ulplint --kernel %s rdma-invalidation-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-invalidation-leak %t.plugin

// Kernel initiator code that exposes request buffers through fast
// registration (IB_WR_REG_MR with remote rights). Each scenario uses its own
// request type, so their MRs are distinct handles.

#include <rdma/rw.h>
#include <linux/slab.h>

struct demo_queue {
	struct ib_qp *qp;
	struct ib_device *dev;
	u32 port;
};

struct demo_completion { int done; };
unsigned long wait_for_completion_timeout(struct demo_completion *c,
					  unsigned long timeout);
void wait_for_completion(struct demo_completion *c);

/* 1. A timeout path gives the MR back to the pool with its rkey live. */
struct demo_tmo_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr send_wr;
	struct ib_send_wr inv_wr;
	struct demo_completion done;
};

static int demo_tmo_submit(struct demo_queue *q, struct demo_tmo_req *req)
{
	int ret;

	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	req->reg_wr.wr.next = &req->send_wr;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;
	req->send_wr.next = NULL;
	ret = ib_post_send(q->qp, &req->reg_wr.wr, NULL);
	if (ret)
		goto out_put;
	if (!wait_for_completion_timeout(&req->done, 1000))
		goto out_put;

	/* The response came: invalidate before giving the MR back. */
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.next = NULL;
	ret = ib_post_send(q->qp, &req->inv_wr, NULL);
	if (!ret)
		wait_for_completion(&req->done);
out_put:
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_mr_pool_put' releases a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	// CHECK-MESSAGES: :[[@LINE-17]]:8: note: rkey handed to the peer here (IB_WR_REG_MR)
	req->mr = NULL;
	return ret;
}

/* 2. A completion handler that skips the invalidation on its error path. */
struct demo_cmpl_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr;
	struct demo_completion inv_done;
};

static int demo_cmpl_register(struct demo_queue *q, struct demo_cmpl_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

static void demo_cmpl_done(struct demo_queue *q, struct demo_cmpl_req *req,
			   struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		goto release;
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	if (ib_post_send(q->qp, &req->inv_wr, NULL))
		return;
	wait_for_completion(&req->inv_done);
release:
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_mr_pool_put' releases a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	// CHECK-MESSAGES: :[[@LINE-11]]:2: note: error path taken here
}

/* 3. A ULP that never invalidates: the request is recycled with its MR. */
struct demo_noinv_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct list_head node;
};

static int demo_noinv_register(struct demo_queue *q, struct demo_noinv_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

static void demo_noinv_complete(struct demo_queue *q, struct demo_noinv_req *req)
{
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_mr_pool_put' releases a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	// CHECK-MESSAGES: :[[@LINE-7]]:9: note: rkey handed to the peer here (IB_WR_REG_MR)
	req->mr = NULL;
}

/* Near miss: nvme-rdma's scheme. The response handler accepts a checked
 * remote invalidation or posts LOCAL_INV; the MR goes back to the pool
 * later, from the request's completion. */
struct demo_nvme_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr;
};

void demo_error_recovery(struct demo_queue *q);
void demo_end_request(struct demo_nvme_req *req);

static int demo_nvme_register(struct demo_queue *q, struct demo_nvme_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

static int demo_nvme_inv_rkey(struct demo_queue *q, struct demo_nvme_req *req)
{
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.next = NULL;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	return ib_post_send(q->qp, &req->inv_wr, NULL);
}

static void demo_nvme_process_rsp(struct demo_queue *q,
				  struct demo_nvme_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(wc->ex.invalidate_rkey != req->mr->rkey))
			demo_error_recovery(q);
	} else if (req->mr) {
		if (demo_nvme_inv_rkey(q, req))
			demo_error_recovery(q);
		/* the local invalidation completion will end the request */
		return;
	}
	demo_end_request(req);
}

static void demo_nvme_unmap_data(struct demo_queue *q, struct demo_nvme_req *req)
{
	if (req->mr) {
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
}

/* Near miss: target-side READs through rdma_rw; the core owns the MRs. */
static int demo_rw_read(struct demo_queue *q, struct rdma_rw_ctx *ctx,
			struct scatterlist *sg, u32 nents, u64 raddr, u32 rkey,
			struct ib_cqe *cqe)
{
	int ret = rdma_rw_ctx_init(ctx, q->qp, q->port, sg, nents, 0, raddr, rkey,
				   DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	ret = rdma_rw_ctx_post(ctx, q->qp, q->port, cqe, NULL);
	if (ret)
		rdma_rw_ctx_destroy(ctx, q->qp, q->port, sg, nents, DMA_FROM_DEVICE);
	return ret;
}

/*
 * Near misses: the message carrying the key is chained after the REG_MR and
 * posted by a helper (or by a function of another file); when that post
 * fails nothing was registered or sent, and unmapping at once is right.
 * The positive twin unmaps after a post that went out.
 */
struct demo_rtrs_req {
	struct ib_device *dev;
	struct ib_qp *qp;
	struct ib_mr *mr;
	struct scatterlist *sg;
	int nents;
	u32 *msg_key;
	struct ib_send_wr imm_wr;
};

static int demo_rtrs_post_chain(struct demo_rtrs_req *r, struct ib_send_wr *head)
{
	head->next = &r->imm_wr; /* the WRITE_WITH_IMM carries the key */
	return ib_post_send(r->qp, head, NULL);
}

int demo_rtrs_read_req(struct demo_rtrs_req *r)
{
	struct ib_reg_wr rwr = {
		.wr.opcode = IB_WR_REG_MR,
		.mr = r->mr,
		.key = r->mr->rkey,
		.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE,
	};
	int ret;

	*r->msg_key = r->mr->rkey;
	ret = demo_rtrs_post_chain(r, &rwr.wr);
	if (ret)
		ib_dma_unmap_sg(r->dev, r->sg, r->nents, DMA_FROM_DEVICE);
	return ret;
}

int demo_rtrs_post_elsewhere(struct ib_qp *qp, struct ib_send_wr *head);

int demo_rtrs_read_req_ext(struct demo_rtrs_req *r)
{
	struct ib_reg_wr rwr = {
		.wr.opcode = IB_WR_REG_MR,
		.mr = r->mr,
		.key = r->mr->rkey,
		.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE,
	};
	int err;

	*r->msg_key = r->mr->rkey;
	err = demo_rtrs_post_elsewhere(r->qp, &rwr.wr);
	if (err)
		ib_dma_unmap_sg(r->dev, r->sg, r->nents, DMA_FROM_DEVICE);
	return err;
}

int demo_rtrs_read_req_sync(struct demo_rtrs_req *r)
{
	struct ib_reg_wr rwr = {
		.wr.opcode = IB_WR_REG_MR,
		.mr = r->mr,
		.key = r->mr->rkey,
		.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE,
	};
	int ret;

	*r->msg_key = r->mr->rkey;
	ret = demo_rtrs_post_chain(r, &rwr.wr);
	if (ret)
		return ret;
	ib_dma_unmap_sg(r->dev, r->sg, r->nents, DMA_FROM_DEVICE);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_dma_unmap_sg' releases the memory behind a memory region whose rkey is still valid for the peer
	return 0;
}
