// RUN: %check_ulplint --kernel %s rdma-unmap-before-invalidate %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-unmap-before-invalidate %t.plugin

// Releasing memory right after posting its LOCAL_INV.

#include <rdma/mr_pool.h>
#include <linux/slab.h>

struct demo_completion { int done; };
void wait_for_completion(struct demo_completion *c);

struct demo_queue {
	struct ib_qp *qp;
	struct ib_device *dev;
};

struct demo_mr {
	struct ib_mr *mr;
	struct ib_send_wr inv_wr;
	struct ib_cqe inv_cqe;
	struct scatterlist *sgl;
	int nents;
	struct demo_completion inv_done;
};

/* Unsignaled LOCAL_INV, then the pages are unmapped at once. */
static void demo_unmap_fast(struct demo_queue *q, struct demo_mr *m)
{
	if (ib_map_mr_sg(m->mr, m->sgl, m->nents, NULL, SZ_4K) < 0)
		return;
	m->inv_wr.opcode = IB_WR_LOCAL_INV;
	m->inv_wr.send_flags = 0;
	m->inv_wr.ex.invalidate_rkey = m->mr->rkey;
	m->inv_wr.next = NULL;
	if (ib_post_send(q->qp, &m->inv_wr, NULL))
		return;
	ib_dma_unmap_sg(q->dev, m->sgl, m->nents, DMA_FROM_DEVICE);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_dma_unmap_sg' runs right after posting an unsignaled LOCAL_INV; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
	// CHECK-MESSAGES: :[[@LINE-4]]:6: note: LOCAL_INV posted here
}

/* Signaled, but the request is freed before the completion arrives. */
static void demo_free_req(struct demo_queue *q, struct demo_mr *m)
{
	m->inv_wr.opcode = IB_WR_LOCAL_INV;
	m->inv_wr.send_flags = IB_SEND_SIGNALED;
	m->inv_wr.wr_cqe = &m->inv_cqe;
	m->inv_wr.ex.invalidate_rkey = m->mr->rkey;
	m->inv_wr.next = NULL;
	ib_post_send(q->qp, &m->inv_wr, NULL);
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, m->mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_mr_pool_put' runs right after posting a LOCAL_INV that nothing waits for
	// CHECK-MESSAGES: :[[@LINE-3]]:2: note: LOCAL_INV posted here
}

/* Near miss: smbdirect waits for the invalidation before unmapping. */
static void ok_wait(struct demo_queue *q, struct demo_mr *m)
{
	if (ib_map_mr_sg(m->mr, m->sgl, m->nents, NULL, SZ_4K) < 0)
		return;
	m->inv_wr.opcode = IB_WR_LOCAL_INV;
	m->inv_wr.send_flags = IB_SEND_SIGNALED;
	m->inv_wr.wr_cqe = &m->inv_cqe;
	m->inv_wr.ex.invalidate_rkey = m->mr->rkey;
	m->inv_wr.next = NULL;
	if (ib_post_send(q->qp, &m->inv_wr, NULL))
		return;
	wait_for_completion(&m->inv_done);
	ib_dma_unmap_sg(q->dev, m->sgl, m->nents, DMA_FROM_DEVICE);
}

/* Near miss: the completion handler of the LOCAL_INV unmaps. */
static void ok_inv_done(struct demo_queue *q, struct demo_mr *m)
{
	ib_dma_unmap_sg(q->dev, m->sgl, m->nents, DMA_FROM_DEVICE);
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, m->mr);
}

/* Teardown of an agent that exposed a status buffer: the MR is destroyed
 * while the unsignaled LOCAL_INV for its key may still be queued. */
struct demo_agent {
	struct ib_qp *qp;
	struct ib_mr *status_mr;
	bool status_exposed;
};

void demo_agent_destroy(struct demo_agent *a)
{
	struct ib_send_wr inv = {
		.opcode = IB_WR_LOCAL_INV,
		.send_flags = 0,
	};

	if (a->status_exposed) {
		inv.ex.invalidate_rkey = a->status_mr->rkey;
		ib_post_send(a->qp, &inv, NULL);
	}
	ib_dereg_mr(a->status_mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_dereg_mr' runs right after posting an unsignaled LOCAL_INV; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
	// CHECK-MESSAGES: :[[@LINE-4]]:3: note: LOCAL_INV posted here
	ib_destroy_qp(a->qp);
}

/* Near miss: the QP is drained first; every queued work request, the
 * LOCAL_INV included, has completed before the MR goes. */
void demo_agent_destroy_drained(struct demo_agent *a)
{
	struct ib_send_wr inv = {
		.opcode = IB_WR_LOCAL_INV,
		.send_flags = 0,
	};

	if (a->status_exposed) {
		inv.ex.invalidate_rkey = a->status_mr->rkey;
		ib_post_send(a->qp, &inv, NULL);
	}
	ib_drain_qp(a->qp);
	ib_dereg_mr(a->status_mr);
	ib_destroy_qp(a->qp);
}

/*
 * A helper that waits for the LOCAL_INV only when asked (`can_wait`), as the
 * RTRS client's complete_rdma_req(): the failover path passes true and
 * deregisters afterwards (near miss); the fast path passes false and
 * deregisters at once (positive, reported at its call).
 */
struct demo_fo_req {
	struct ib_qp *qp;
	struct ib_mr *mr;
	struct ib_cqe inv_cqe;
	struct demo_completion inv_comp;
};

static void demo_fo_finish(struct demo_fo_req *r, bool can_wait)
{
	struct ib_send_wr wr = {
		.opcode = IB_WR_LOCAL_INV,
		.wr_cqe = &r->inv_cqe,
		.send_flags = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = r->mr->rkey,
	};

	if (ib_post_send(r->qp, &wr, NULL))
		return;
	if (can_wait)
		wait_for_completion(&r->inv_comp);
}

void demo_fo_fail_over(struct demo_fo_req *r)
{
	demo_fo_finish(r, true);
	ib_dereg_mr(r->mr);
}

void demo_fo_fast_fail(struct demo_fo_req *r)
{
	demo_fo_finish(r, false);
	ib_dereg_mr(r->mr);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'ib_dereg_mr' runs right after posting a LOCAL_INV that nothing waits for
	// CHECK-MESSAGES: :[[@LINE-17]]:6: note: LOCAL_INV posted here
}
