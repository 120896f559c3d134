// RUN: %check_ulplint --kernel %s rdma-local-mr-management %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-local-mr-management %t.plugin

// A kernel ULP with a hand-managed initiator side (fast registration with
// an MR pool, rkey in the command) and a target side on rdma_rw.

#include <rdma/mr_pool.h>
#include <rdma/rw.h>
#include <linux/slab.h>

struct demo_cmd {
	__le64 addr;
	__le32 rkey;
	__le32 len;
};

struct demo_queue {
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct ib_device *dev;
	u32 port;
	int depth;
	struct ib_mr *spare;
	struct list_head fr_mrs; /* the initiator's own fast-registration MRs */
};

struct demo_req {
	struct demo_queue *queue;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr send_wr;
	struct scatterlist *sg;
	int nents;
	struct demo_cmd *cmd;
};

/* Initiator: the MR pool is built by the ULP... */
static int demo_init_queue(struct demo_queue *q)
{
	q->spare = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, 16);
	// CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'ib_alloc_mr' allocates a memory region to give the peer a key to local memory; the ULP manages registration itself; use ib_mr_pool_get/put with IB_WR_REG_MR, the closest existing API (no core API exposes memory to a peer yet; regcore's remote-registration context, docs/regcore.md, is the proposed one) [rdma-local-mr-management]
	if (IS_ERR(q->spare))
		return PTR_ERR(q->spare);
	return ib_mr_pool_init(q->qp, &q->fr_mrs, q->depth,
	// CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'ib_mr_pool_init' builds a pool of memory regions to give the peer a key to local memory
			       IB_MR_TYPE_MEM_REG, 16, 0);
}

/* ... and each I/O takes an MR, maps the pages and registers them for the
 * target to write. */
static int demo_map_data(struct demo_queue *q, struct demo_req *req)
{
	int n;

	req->mr = ib_mr_pool_get(q->qp, &q->fr_mrs);
	// CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'ib_mr_pool_get' takes a memory region from its pool to give the peer a key to local memory
	if (!req->mr)
		return -EAGAIN;
	n = ib_map_mr_sg(req->mr, req->sg, req->nents, NULL, 4096);
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: 'ib_map_mr_sg' maps pages into a memory region to give the peer a key to local memory
	if (n < req->nents) {
		ib_mr_pool_put(q->qp, &q->fr_mrs, req->mr);
		// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'ib_mr_pool_put' puts a memory region back into its pool to give the peer a key to local memory
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'IB_WR_REG_MR' posts a registration work request to give the peer a key to local memory
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	req->reg_wr.wr.next = &req->send_wr;
	req->cmd->addr = cpu_to_le64(req->mr->iova);
	req->cmd->rkey = cpu_to_le32(req->mr->rkey);
	req->cmd->len = cpu_to_le32(req->mr->length);
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

static void demo_free_queue(struct demo_queue *q)
{
	ib_mr_pool_destroy(q->qp, &q->fr_mrs);
	ib_dereg_mr(q->spare);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_dereg_mr' deregisters a memory region to give the peer a key to local memory
}

/* Target side on rdma_rw: already core-managed, not reported; neither is
 * the pool of MRs rdma_rw itself takes on iWARP, which some ULPs set up by
 * hand (ksmbd). */
static int demo_target_qp_setup(struct demo_queue *q)
{
	return ib_mr_pool_init(q->qp, &q->qp->rdma_mrs, q->depth,
			       IB_MR_TYPE_MEM_REG, 16, 0);
}

struct demo_rsp {
	struct rdma_rw_ctx rw;
	struct ib_cqe cqe;
	struct scatterlist *sg;
	u32 sg_cnt;
};

static int demo_target_read(struct demo_queue *q, struct demo_rsp *rsp,
			    u64 remote_addr, u32 rkey)
{
	int ret;

	ret = rdma_rw_ctx_init(&rsp->rw, q->qp, q->port, rsp->sg, rsp->sg_cnt, 0,
			       remote_addr, rkey, DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	return rdma_rw_ctx_post(&rsp->rw, q->qp, q->port, &rsp->cqe, NULL);
}
