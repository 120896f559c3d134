/*
 * atomic_bw: fetch-and-add / compare-and-swap bandwidth in the style of
 * perftest.  The target buffer (8 bytes per outstanding op) is exposed
 * with remote atomic rights and its key exchanged out of band; the client
 * keeps tx_depth atomics in flight and requests a completion every cq_mod
 * posts.
 *
 * Not correct: the moderation counter the post loop tests
 * (ctx->tx_since_cqe) is not the one it increments (ctx->tx_since_cq, a
 * leftover field); the signaled branch never runs, the send queue fills
 * after tx_depth posts, and the test stalls on its first window.
 * Correct: registration flags (LOCAL_WRITE with REMOTE_ATOMIC), the key
 * exchange, the queue clamp.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ab_ctx {
	struct ibv_context *context;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *mr;
	uint64_t           *buf;
	unsigned int        tx_depth;
	unsigned int        cq_mod;
	unsigned int        tx_since_cq;	/* old name, no longer read */
	unsigned int        tx_since_cqe;
	uint64_t            posted, completed;
};

struct ab_dest {
	uint64_t vaddr;
	uint32_t rkey;
};

int ab_init(struct ab_ctx *ctx, unsigned int tx_depth, struct ab_dest *my)
{
	struct ibv_device_attr attr;
	struct ibv_qp_init_attr qpa;

	if (ibv_query_device(ctx->context, &attr))
		return -errno;
	if (attr.atomic_cap == IBV_ATOMIC_NONE)
		return -EOPNOTSUPP;
	ctx->tx_depth = tx_depth < (unsigned int)attr.max_qp_wr ? tx_depth : (unsigned int)attr.max_qp_wr;
	ctx->buf = calloc(ctx->tx_depth, sizeof(uint64_t));
	if (!ctx->buf)
		return -ENOMEM;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE with REMOTE_ATOMIC */
	ctx->mr = ibv_reg_mr(ctx->pd, ctx->buf, ctx->tx_depth * sizeof(uint64_t), // BUG: rdma-local-mr-management -- rkey exchanged with the peer; lkey receives the atomic results
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
			     IBV_ACCESS_REMOTE_READ);
	if (!ctx->mr)
		goto err_buf;
	ctx->cq = ibv_create_cq(ctx->context, ctx->tx_depth, NULL, NULL, 0);
	if (!ctx->cq)
		goto err_mr;
	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = ctx->cq;
	qpa.recv_cq = ctx->cq;
	qpa.qp_type = IBV_QPT_RC;
	/* OK: rdma-queue-cap-unchecked -- clamped to max_qp_wr */
	qpa.cap.max_send_wr = ctx->tx_depth;
	qpa.cap.max_recv_wr = 1;
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	ctx->qp = ibv_create_qp(ctx->pd, &qpa);
	if (!ctx->qp)
		goto err_cq;
	my->vaddr = (uintptr_t)ctx->buf;
	my->rkey = ctx->mr->rkey;
	return 0;

err_cq:
	ibv_destroy_cq(ctx->cq);
err_mr:
	ibv_dereg_mr(ctx->mr);
err_buf:
	free(ctx->buf);
	return -EIO;
}

int ab_run(struct ab_ctx *ctx, const struct ab_dest *rem, uint64_t iters, int cas)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc[16];
	int n, i;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.atomic.rkey = rem->rkey;
	wr.wr.atomic.compare_add = 1;

	ctx->posted = ctx->completed = 0;
	ctx->tx_since_cqe = 0;
	while (ctx->completed < iters) {
		while (ctx->posted < iters && ctx->posted - ctx->completed < ctx->tx_depth) {
			unsigned int slot = ctx->posted % ctx->tx_depth;

			sge.addr = (uintptr_t)&ctx->buf[slot];
			sge.length = sizeof(uint64_t);
			sge.lkey = ctx->mr->lkey;
			wr.wr.atomic.remote_addr = rem->vaddr + slot * sizeof(uint64_t);
			wr.wr_id = ctx->posted;
			wr.send_flags = 0;
			// BUG: rdma-unsignaled-send-starvation -- tx_since_cqe is never advanced (the loop increments tx_since_cq)
			if (ctx->tx_since_cqe >= ctx->cq_mod - 1) {
				wr.send_flags = IBV_SEND_SIGNALED;
				ctx->tx_since_cqe = 0;
			}
			if (ibv_post_send(ctx->qp, &wr, &bad)) {
				fprintf(stderr, "post failed after %llu\n", (unsigned long long)ctx->posted);
				return -EIO;
			}
			ctx->tx_since_cq++;
			ctx->posted++;
		}
		n = ibv_poll_cq(ctx->cq, 16, wc);
		if (n < 0)
			return -EIO;
		for (i = 0; i < n; i++)
			ctx->completed = wc[i].wr_id + 1;
	}
	return 0;
}
