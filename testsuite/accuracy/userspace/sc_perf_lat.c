/*
 * sc_perf_lat.c - rdma_lat: ping-pong latency tool in the style of perftest.
 *
 *   rdma_lat -d mlx5_0 -v write|read|send|atomic [-s size] [-n iters]
 *            [--use-mw] [--odp] [--reg-each] <server>
 *
 * One buffer is registered for the test and its key (or, with --use-mw, the
 * key of a type 1 memory window bound over it) is exchanged out of band.
 * --reg-each registers the message buffer around every iteration to mimic
 * an application without a registration cache. A small timestamp ring
 * receives the peer's time stamps with SENDs.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-rkey-reuse,
 *   rdma-send-queue-undersized, rdma-send-queue-manual-factor,
 *   rdma-unsignaled-send-starvation, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked -- not reviewed for this file
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define SUCCESS       0
#define FAILURE       1
#define MAX_TX_DEPTH  2048
#define MAX_SEND_SGE  8
#define TS_RING       64
#define CTX_POLL_BATCH 16

enum verb_type { SEND, WRITE, READ, ATOMIC };

struct perftest_parameters {
	const char            *ib_devname;
	enum verb_type         verb;
	enum ibv_transport_type transport_type;
	uint64_t               size;
	int                    iters;
	int                    use_mw;
	int                    use_odp;
	int                    reg_each;
	int                    inline_size;
};

struct pingpong_dest { uint32_t qpn, psn, rkey; uint64_t vaddr; };

struct pingpong_context {
	struct ibv_context *context;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	void               *buf;
	uint64_t            size;
	struct ibv_mr      *mr;
	struct ibv_mw      *mw;
	uint64_t           *ts_buf;
	struct ibv_mr      *ts_mr;
};

int ctx_xchg(int sock, const void *mine, void *theirs, size_t len);

static struct option long_opts[] = {
	{ "ib-dev",   1, NULL, 'd' }, { "verb",     1, NULL, 'v' },
	{ "size",     1, NULL, 's' }, { "iters",    1, NULL, 'n' },
	{ "use-mw",   0, NULL, 'W' }, { "odp",      0, NULL, 'O' },
	{ "reg-each", 0, NULL, 'R' }, { NULL, 0, NULL, 0 },
};

int parser(struct perftest_parameters *p, int argc, char **argv)
{
	int c;

	memset(p, 0, sizeof(*p));
	p->size = 2;
	p->iters = 1000;
	while ((c = getopt_long(argc, argv, "d:v:s:n:WOR", long_opts, NULL)) != -1) {
		switch (c) {
		case 'd': p->ib_devname = optarg; break;
		case 'v':
			p->verb = !strcmp(optarg, "write") ? WRITE : !strcmp(optarg, "read") ? READ :
				  !strcmp(optarg, "atomic") ? ATOMIC : SEND;
			break;
		case 's': p->size = strtoull(optarg, NULL, 0); break;
		case 'n': p->iters = atoi(optarg); break;
		case 'W': p->use_mw = 1; break;
		case 'O': p->use_odp = 1; break;
		case 'R': p->reg_each = 1; break;
		default: return FAILURE;
		}
	}
	if (p->use_mw && (p->verb == SEND || p->verb == ATOMIC)) {
		fprintf(stderr, " --use-mw needs -v write or -v read\n");
		return FAILURE;
	}
	return SUCCESS;
}

int create_mr(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	int flags = IBV_ACCESS_LOCAL_WRITE;

	if (user_param->verb == WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	if (user_param->verb == READ) {
		flags |= IBV_ACCESS_REMOTE_READ;
		if (user_param->transport_type == IBV_TRANSPORT_IWARP)
			flags |= IBV_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-transport -- READ-sink rights decided by an inline iWARP test */
	}
	if (user_param->verb == ATOMIC)
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
	if (user_param->use_mw)
		flags = IBV_ACCESS_MW_BIND;	/* the window carries the remote rights */
	if (user_param->use_odp)
		flags |= IBV_ACCESS_ON_DEMAND;

	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE is kept whenever a remote right is asked */
	/* OK: rdma-remote-access-overbroad -- the rkey is exchanged in ctx_hand_shake() */
	ctx->mr = ibv_reg_mr(ctx->pd, ctx->buf, ctx->size, flags); /* BUG: rdma-local-mr-management -- the peer gets this MR's key */
	if (!ctx->mr) {
		fprintf(stderr, "Couldn't allocate MR\n");
		return FAILURE;
	}

	ctx->ts_buf = calloc(TS_RING, sizeof(uint64_t));
	if (!ctx->ts_buf)
		goto mr_fail;
	/* BUG: rdma-remote-access-overbroad -- the timestamp ring only receives SENDs; its rkey is never exchanged */
	ctx->ts_mr = ibv_reg_mr(ctx->pd, ctx->ts_buf, TS_RING * sizeof(uint64_t),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-local-mr-management -- receive ring registered once */
	if (!ctx->ts_mr) {
		fprintf(stderr, "Couldn't allocate timestamp MR\n");
		free(ctx->ts_buf);
		return FAILURE; /* BUG: rdma-mr-leak -- ctx->mr is still registered */
	}
	return SUCCESS;

mr_fail:
	ibv_dereg_mr(ctx->mr);
	return FAILURE;
}

int bind_mw(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	struct ibv_mw_bind bind = {0};

	ctx->mw = ibv_alloc_mw(ctx->pd, IBV_MW_TYPE_1); /* BUG: rdma-local-mr-management -- memory window managed by the tool */
	if (!ctx->mw) {
		fprintf(stderr, "Couldn't allocate MW\n");
		return FAILURE;
	}
	bind.wr_id = 0;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info.mr = ctx->mr;
	bind.bind_info.addr = (uintptr_t)ctx->buf;
	bind.bind_info.length = ctx->size;
	bind.bind_info.mw_access_flags = user_param->verb == WRITE ?
		IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ; /* BUG: rdma-access-flags-invalid -- a REMOTE_WRITE window over an MR registered with MW_BIND only */
	if (ibv_bind_mw(ctx->qp, ctx->mw, &bind)) { /* BUG: rdma-local-mr-management -- window bind done by the tool */
		fprintf(stderr, "Couldn't bind MW\n");
		ibv_dealloc_mw(ctx->mw);
		return FAILURE; /* OK: rdma-mr-leak -- the window was deallocated; ctx->mr belongs to destroy_ctx() */
	}
	return SUCCESS;
}

int ctx_hand_shake(int sock, struct pingpong_context *ctx,
		   struct perftest_parameters *user_param, struct pingpong_dest *rem)
{
	struct pingpong_dest my = {0};

	my.qpn = ctx->qp->qp_num;
	my.psn = (uint32_t)lrand48() & 0xffffff;
	my.rkey = user_param->use_mw ? ctx->mw->rkey : ctx->mr->rkey;
	my.vaddr = (uintptr_t)ctx->buf;
	return ctx_xchg(sock, &my, rem, sizeof(my));
}

static int poll_one(struct pingpong_context *ctx)
{
	struct ibv_wc wc[CTX_POLL_BATCH];
	int ne;

	do {
		ne = ibv_poll_cq(ctx->cq, CTX_POLL_BATCH, wc);
	} while (ne == 0);
	if (ne < 0 || wc[0].status != IBV_WC_SUCCESS) {
		fprintf(stderr, "Completion with error\n");
		return FAILURE;
	}
	return SUCCESS;
}

/* A few untimed writes from a scratch buffer to settle the path. */
int run_warmup(struct pingpong_context *ctx, struct pingpong_dest *rem)
{
	struct ibv_send_wr wr = {0}, *bad_wr;
	struct ibv_sge sge;
	struct ibv_mr *wmr;
	char wbuf[64];
	int i, rc = SUCCESS;

	memset(wbuf, 0xa5, sizeof(wbuf));
	/* OK: rdma-registration-in-datapath -- registered once, before the loop that posts */
	wmr = ibv_reg_mr(ctx->pd, wbuf, sizeof(wbuf), IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- source of the tool's own RDMA WRITEs */
	if (!wmr)
		return FAILURE;
	sge.addr = (uintptr_t)wbuf;
	sge.length = sizeof(wbuf);
	sge.lkey = wmr->lkey;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = rem->vaddr;
	wr.wr.rdma.rkey = rem->rkey;
	for (i = 0; i < 8 && rc == SUCCESS; i++) {
		if (ibv_post_send(ctx->qp, &wr, &bad_wr))
			rc = FAILURE;
		else
			rc = poll_one(ctx);
	}
	ibv_dereg_mr(wmr); /* OK: rdma-registration-in-datapath, rdma-mr-leak -- released once after the loop, on every path */
	return rc;
}

int run_iter_lat_write(struct pingpong_context *ctx, struct perftest_parameters *user_param,
		       struct pingpong_dest *rem)
{
	struct ibv_send_wr wr = {0}, *bad_wr;
	struct ibv_mr *iter_mr = NULL;
	struct ibv_sge sge;
	int scnt;

	sge.addr = (uintptr_t)ctx->buf;
	sge.length = (uint32_t)user_param->size;
	sge.lkey = ctx->mr->lkey;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = rem->vaddr;
	wr.wr.rdma.rkey = rem->rkey;

	for (scnt = 0; scnt < user_param->iters; scnt++) {
		if (user_param->reg_each) {
			iter_mr = ibv_reg_mr(ctx->pd, ctx->buf, user_param->size, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- registered inside the measured loop */
			if (!iter_mr)
				return FAILURE;
			sge.lkey = iter_mr->lkey;
		}
		if (ibv_post_send(ctx->qp, &wr, &bad_wr)) {
			fprintf(stderr, "Couldn't post send: scnt=%d\n", scnt);
			return FAILURE; /* BUG: rdma-mr-leak -- the per-iteration MR is not released */
		}
		if (poll_one(ctx))
			goto fail;
		if (iter_mr) {
			ibv_dereg_mr(iter_mr); /* BUG: rdma-registration-in-datapath -- deregistered every iteration */
			iter_mr = NULL;
		}
	}
	return SUCCESS;
fail:
	if (iter_mr)
		ibv_dereg_mr(iter_mr); /* BUG: rdma-registration-in-datapath -- per-iteration MR released in the loop's error path */
	return FAILURE;
}

int run_iter_lat_read(struct pingpong_context *ctx, struct perftest_parameters *user_param,
		      struct pingpong_dest *rem)
{
	struct ibv_sge sge = { (uintptr_t)ctx->buf, (uint32_t)user_param->size, ctx->mr->lkey };
	struct ibv_send_wr wr = {0}, *bad_wr;
	int scnt;

	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = rem->vaddr;
	wr.wr.rdma.rkey = rem->rkey;
	for (scnt = 0; scnt < user_param->iters; scnt++) {
		if (ibv_post_send(ctx->qp, &wr, &bad_wr)) /* OK: rdma-access-flags-transport -- create_mr() gives the sink REMOTE_WRITE on iWARP */
			return FAILURE;
		if (poll_one(ctx))
			return FAILURE;
	}
	return SUCCESS;
}

int ctx_init(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	struct ibv_device_attr dev_attr;
	struct ibv_qp_init_attr attr = {0};

	user_param->transport_type = ctx->context->device->transport_type;
	if (ibv_query_device(ctx->context, &dev_attr))
		return FAILURE;
	if (MAX_TX_DEPTH > dev_attr.max_qp_wr) {
		fprintf(stderr, " device supports only %d WRs per QP\n", dev_attr.max_qp_wr);
		return FAILURE;
	}
	ctx->pd = ibv_alloc_pd(ctx->context);
	if (!ctx->pd)
		return FAILURE;
	ctx->size = user_param->size;
	if (posix_memalign(&ctx->buf, 4096, ctx->size))
		return FAILURE;
	ctx->cq = ibv_create_cq(ctx->context, MAX_TX_DEPTH + TS_RING, NULL, NULL, 0);
	if (!ctx->cq)
		return FAILURE;

	attr.send_cq = ctx->cq;
	attr.recv_cq = ctx->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = MAX_TX_DEPTH; /* OK: rdma-queue-cap-unchecked -- compared with max_qp_wr above */
	attr.cap.max_recv_wr = TS_RING;
	attr.cap.max_send_sge = MAX_SEND_SGE; /* BUG: rdma-queue-cap-unchecked -- 8 SGEs, max_sge is never consulted */
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = user_param->inline_size;
	ctx->qp = ibv_create_qp(ctx->pd, &attr);
	if (!ctx->qp)
		return FAILURE;
	if (create_mr(ctx, user_param))
		return FAILURE;
	if (user_param->use_mw && bind_mw(ctx, user_param))
		return FAILURE;
	return SUCCESS;
}

void destroy_ctx(struct pingpong_context *ctx)
{
	if (ctx->mw)
		ibv_dealloc_mw(ctx->mw);
	if (ctx->ts_mr)
		ibv_dereg_mr(ctx->ts_mr);
	if (ctx->mr)
		ibv_dereg_mr(ctx->mr);
	if (ctx->qp)
		ibv_destroy_qp(ctx->qp);
	if (ctx->cq)
		ibv_destroy_cq(ctx->cq);
	if (ctx->pd)
		ibv_dealloc_pd(ctx->pd);
	free(ctx->ts_buf);
	free(ctx->buf);
}
