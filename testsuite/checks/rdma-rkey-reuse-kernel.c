// RUN: %check_ulplint --kernel %s rdma-rkey-reuse %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-rkey-reuse %t.plugin

// Pooled fast-registration MRs registered again for every I/O.

#include <rdma/mr_pool.h>

struct demo_queue {
	struct ib_qp *qp;
};

struct demo_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct scatterlist *sgl;
	int nents;
};

struct demo_ok_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
};

static int demo_map(struct demo_queue *q, struct demo_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	if (ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K) < req->nents) {
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		return -EINVAL;
	}
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: IB_WR_REG_MR re-registers an MR without rotating its key (ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey))); a peer that kept the old rkey reaches the new buffer [rdma-rkey-reuse]
	// CHECK-MESSAGES: :[[@LINE-10]]:12: note: MR taken from 'ib_mr_pool_get' here
	// CHECK-FIXES: ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	// CHECK-FIXES-NEXT: req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

/* Near miss: nvme-rdma rotates the key before each registration. */
static int ok_map(struct demo_queue *q, struct demo_ok_req *req)
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
