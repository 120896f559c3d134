/*
 * write_bw: an RDMA WRITE bandwidth test in the style of perftest.  Both
 * sides register one buffer with every right (the client writes into the
 * server's buffer, the server may be asked to write back), exchange
 * LID/QPN/PSN/GID/address/rkey over a TCP socket, and the client keeps
 * tx_depth WRITEs in flight, signaling one out of every cq_mod.
 *
 * Correct: the rkey really goes to the peer (the TCP exchange); signaling
 * is driven by a counter the post loop advances; the send queue is sized
 * by the tx_depth window the loop respects.
 * Not correct: the inline size is the tool's historical default of 220
 * bytes, requested without looking at the device (many providers accept
 * less, and QP creation fails there).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PERF_MAX_INLINE		220
#define PERF_DEF_TX_DEPTH	128
#define PERF_DEF_CQ_MOD		100
#define PERF_POLL_BATCH		16

struct perf_dest {
	uint16_t	lid;
	uint32_t	qpn;
	uint32_t	psn;
	union ibv_gid	gid;
	uint64_t	vaddr;
	uint32_t	rkey;
	uint32_t	size;
};

struct perf_params {
	int		tx_depth;
	int		cq_mod;
	uint32_t	size;
	uint64_t	iters;
	int		ib_port;
	int		sockfd;
};

struct perf_ctx {
	struct ibv_context	*context;
	struct ibv_pd		*pd;
	struct ibv_mr		*mr;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	void			*buf;
	uint64_t		scnt;
	uint64_t		ccnt;
};

int perf_ctx_init(struct perf_ctx *ctx, struct ibv_device *dev, struct perf_params *user)
{
	struct ibv_qp_init_attr attr;

	ctx->context = ibv_open_device(dev);
	if (!ctx->context)
		return -1;
	ctx->pd = ibv_alloc_pd(ctx->context);
	if (!ctx->pd)
		goto clean_device;

	if (posix_memalign(&ctx->buf, sysconf(_SC_PAGESIZE), user->size))
		goto clean_pd;
	memset(ctx->buf, 0, user->size);
	/* OK: rdma-remote-access-overbroad -- address and rkey are sent to the peer in perf_exchange() */
	ctx->mr = ibv_reg_mr(ctx->pd, ctx->buf, user->size, // BUG: rdma-local-mr-management -- rkey handed to the peer and lkey used for the ULP's own WRITEs
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			     IBV_ACCESS_REMOTE_READ);
	if (!ctx->mr) {
		fprintf(stderr, "Couldn't allocate MR\n");
		goto clean_buf;
	}

	ctx->cq = ibv_create_cq(ctx->context, user->tx_depth, NULL, NULL, 0);
	if (!ctx->cq)
		goto clean_mr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ctx->cq;
	attr.recv_cq = ctx->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- one WRITE per iteration and at most tx_depth of them in flight */
	attr.cap.max_send_wr = user->tx_depth;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = PERF_MAX_INLINE; // BUG: rdma-queue-cap-unchecked -- 220 inline bytes requested without comparing with the device
	ctx->qp = ibv_create_qp(ctx->pd, &attr);
	if (!ctx->qp) {
		fprintf(stderr, "Couldn't create QP\n");
		goto clean_cq;
	}
	return 0;

clean_cq:
	ibv_destroy_cq(ctx->cq);
clean_mr:
	/* OK: rdma-mr-leak -- released on every failure after the registration */
	ibv_dereg_mr(ctx->mr);
clean_buf:
	free(ctx->buf);
clean_pd:
	ibv_dealloc_pd(ctx->pd);
clean_device:
	ibv_close_device(ctx->context);
	return -1;
}

int perf_exchange(struct perf_ctx *ctx, struct perf_params *user,
		  struct perf_dest *my, struct perf_dest *rem)
{
	struct ibv_port_attr port;

	if (ibv_query_port(ctx->context, user->ib_port, &port))
		return -1;
	my->lid = port.lid;
	my->qpn = ctx->qp->qp_num;
	my->psn = lrand48() & 0xffffff;
	if (ibv_query_gid(ctx->context, user->ib_port, 0, &my->gid))
		return -1;
	my->vaddr = (uintptr_t)ctx->buf;
	my->rkey = ctx->mr->rkey;
	my->size = user->size;

	if (write(user->sockfd, my, sizeof(*my)) != sizeof(*my))
		return -1;
	if (read(user->sockfd, rem, sizeof(*rem)) != sizeof(*rem))
		return -1;
	return 0;
}

int perf_run_write(struct perf_ctx *ctx, struct perf_params *user,
		   const struct perf_dest *rem)
{
	struct ibv_wc wc[PERF_POLL_BATCH];
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	int ne, i;

	sge.addr = (uintptr_t)ctx->buf;
	sge.length = user->size;
	sge.lkey = ctx->mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = rem->vaddr;
	wr.wr.rdma.rkey = rem->rkey;

	ctx->scnt = ctx->ccnt = 0;
	while (ctx->scnt < user->iters || ctx->ccnt < user->iters) {
		while (ctx->scnt < user->iters &&
		       ctx->scnt - ctx->ccnt < (uint64_t)user->tx_depth) {
			wr.send_flags = 0;
			if (user->size <= PERF_MAX_INLINE)
				wr.send_flags |= IBV_SEND_INLINE;
			/* OK: rdma-unsignaled-send-starvation -- one in cq_mod is signaled; scnt advances below */
			if (ctx->scnt % user->cq_mod == (uint64_t)user->cq_mod - 1 ||
			    ctx->scnt == user->iters - 1)
				wr.send_flags |= IBV_SEND_SIGNALED;
			wr.wr_id = ctx->scnt;
			if (ibv_post_send(ctx->qp, &wr, &bad)) {
				fprintf(stderr, "post failed at %" PRIu64 "\n", ctx->scnt);
				return -1;
			}
			ctx->scnt++;
		}
		ne = ibv_poll_cq(ctx->cq, PERF_POLL_BATCH, wc);
		if (ne < 0)
			return -1;
		for (i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "completion error %s\n",
					ibv_wc_status_str(wc[i].status));
				return -1;
			}
			ctx->ccnt = wc[i].wr_id + 1;
		}
	}
	return 0;
}

void perf_ctx_destroy(struct perf_ctx *ctx)
{
	ibv_destroy_qp(ctx->qp);
	ibv_destroy_cq(ctx->cq);
	ibv_dereg_mr(ctx->mr);
	free(ctx->buf);
	ibv_dealloc_pd(ctx->pd);
	ibv_close_device(ctx->context);
}
