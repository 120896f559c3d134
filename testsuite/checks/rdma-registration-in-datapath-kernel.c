// RUN: %check_ulplint --kernel %s rdma-registration-in-datapath %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-registration-in-datapath %t.plugin

// A kernel initiator that allocates its fast-registration MR per request
// on the submit path and frees it from the completion handler.

#include <rdma/mr_pool.h>
#include <rdma/rw.h>
#include <linux/slab.h>

struct demo_queue {
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct list_head mrs;
	struct ib_mr **setup_mrs;
	int depth;
};

struct demo_req {
	struct demo_queue *queue;
	struct ib_mr *mr;
	struct ib_cqe reg_cqe;
	struct ib_cqe inv_cqe;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr send_wr;
	struct scatterlist *sg;
	int nents;
};

/* 1. Called from the submit path: an MR allocation per I/O. */
static int demo_map_data(struct demo_queue *q, struct demo_req *req)
{
	req->mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, req->nents);
	// CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'ib_alloc_mr' runs once per I/O: it is called from 'demo_queue_rq', which posts work requests (ib_post_send); allocating a memory region is a command to the device on every I/O; use ib_mr_pool_init() at queue setup and ib_mr_pool_get/put per I/O, or rdma_rw [rdma-registration-in-datapath]
	// CHECK-MESSAGES: :[[@LINE+18]]:9: note: 'demo_queue_rq' posts work requests (ib_post_send) here
	if (IS_ERR(req->mr))
		return PTR_ERR(req->mr);
	if (ib_map_mr_sg(req->mr, req->sg, req->nents, NULL, 4096) != req->nents)
		return -EINVAL;
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	req->reg_wr.wr.next = &req->send_wr;
	return 0;
}

static int demo_queue_rq(struct demo_queue *q, struct demo_req *req)
{
	if (demo_map_data(q, req))
		return -EIO;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

/* 2. The completion handler of the invalidation frees the MR per I/O. */
static void demo_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct demo_req *req = container_of(wc->wr_cqe, struct demo_req, inv_cqe);

	ib_dereg_mr(req->mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_dereg_mr' runs once per I/O: 'demo_inv_done' handles completions; deregistering is a command to the device on every I/O
	// CHECK-MESSAGES: :[[@LINE-6]]:13: note: 'demo_inv_done' handles completions here
	req->mr = NULL;
}

/* Near misses. */

/* MRs allocated once per queue at setup, in a loop over the queue depth. */
static int demo_alloc_queue(struct demo_queue *q)
{
	int i;

	for (i = 0; i < q->depth; i++) {
		q->setup_mrs[i] = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, 32);
		if (IS_ERR(q->setup_mrs[i]))
			goto out_free;
	}
	return ib_mr_pool_init(q->qp, &q->mrs, q->depth, IB_MR_TYPE_MEM_REG, 32, 0);

out_free:
	while (--i >= 0)
		ib_dereg_mr(q->setup_mrs[i]);
	return -ENOMEM;
}

/* Taking an MR from the pool per I/O is what pools are for. */
static int demo_queue_pooled(struct demo_queue *q, struct demo_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->mrs);
	if (!req->mr)
		return -EAGAIN;
	req->reg_wr.mr = req->mr;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

/* Near miss: after login, the session fills its connection's table of
 * fast-registration MRs in a loop, once per connection; the login request
 * it then posts does not make the table per I/O. */
#define DEMO_SESSION_CMDS 16

struct demo_session {
	struct ib_pd *pd;
	struct ib_qp *qp;
	struct ib_mr *cmd_mrs[DEMO_SESSION_CMDS];
	struct ib_send_wr login_wr;
};

int demo_session_start(struct demo_session *s)
{
	int i;

	for (i = 0; i < DEMO_SESSION_CMDS; i++) {
		s->cmd_mrs[i] = ib_alloc_mr(s->pd, IB_MR_TYPE_MEM_REG, 32);
		if (IS_ERR(s->cmd_mrs[i])) {
			int ret = PTR_ERR(s->cmd_mrs[i]);

			while (--i >= 0)
				ib_dereg_mr(s->cmd_mrs[i]);
			return ret;
		}
	}
	return ib_post_send(s->qp, &s->login_wr, NULL);
}
