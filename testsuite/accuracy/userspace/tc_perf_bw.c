/*
 * tc_perf_bw.c - RDMA WRITE bandwidth / SEND latency micro-benchmark in the
 * style of perftest (ib_write_bw, ib_send_lat).
 *
 * One data buffer and MR per QP, registered at context init with the
 * rights the verb under test needs; the keys are exchanged out of band in
 * struct pingpong_dest.  With --odp the buffers are registered on demand,
 * and with --odp_implicit the whole address space is registered once.  With
 * --cold_cache the source of every iteration is taken from a large arena so
 * that it is never hot in the HCA's translation cache.
 *
 * Problems: the implicit ODP registration grants remote access to the whole
 * address space; context init unwinds from the wrong label when the CQ
 * cannot be created and forgets the control MR; the bandwidth loop leaks the arena MR when a post fails; the
 * latency loop registers and deregisters each cold slice per iteration.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- queue sizing and signaling are not reviewed here
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define SUCCESS		0
#define FAILURE		1
#define MAX_QPS		16
#define CTRL_SIZE	64
#define CQ_MODERATION	100

enum verb_type { SEND, WRITE, READ, ATOMIC };

struct perftest_parameters {
	enum verb_type	verb;
	int		num_of_qps;
	size_t		size;
	size_t		buff_size;
	uint64_t	iters;
	int		tx_depth;
	int		use_odp;
	int		odp_implicit;
	int		cold_cache;
	size_t		cold_arena_size;
};

struct pingpong_dest {
	uint32_t	qpn;
	uint32_t	psn;
	uint32_t	rkey;
	uint64_t	vaddr;
};

struct pingpong_context {
	struct ibv_context	*context;
	struct ibv_pd		*pd;
	struct ibv_cq		*send_cq;
	struct ibv_qp		*qp[MAX_QPS];
	void			*buf[MAX_QPS];
	struct ibv_mr		*mr[MAX_QPS];
	struct ibv_mr		*odp_mr;
	char			*ctrl_buf;
	struct ibv_mr		*ctrl_mr;
	char			*cold_arena;
	struct ibv_send_wr	wr[MAX_QPS];
	struct ibv_sge		sge_list[MAX_QPS];
};

extern int ctx_hand_shake(struct pingpong_dest *my, struct pingpong_dest *rem);

static int create_single_mr(struct pingpong_context *ctx,
			    struct perftest_parameters *user_param, int qp_index)
{
	int flags = IBV_ACCESS_LOCAL_WRITE;

	if (posix_memalign(&ctx->buf[qp_index], 4096, user_param->buff_size)) {
		fprintf(stderr, "Couldn't allocate work buf.\n");
		return FAILURE;
	}
	memset(ctx->buf[qp_index], 0, user_param->buff_size);

	if (user_param->verb == WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	else if (user_param->verb == READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	else if (user_param->verb == ATOMIC)
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
	if (user_param->use_odp)
		flags |= IBV_ACCESS_ON_DEMAND;

	/* BUG: rdma-local-mr-management -- the buffer's rkey goes to the peer in pingpong_dest and its lkey addresses the test's own RDMA ops */
	ctx->mr[qp_index] = ibv_reg_mr(ctx->pd, ctx->buf[qp_index], user_param->buff_size, flags); // OK: rdma-remote-access-overbroad -- the rights match the verb under test and the key is exchanged; ODP here covers one buffer
	if (!ctx->mr[qp_index]) {
		fprintf(stderr, "Couldn't allocate MR\n");
		free(ctx->buf[qp_index]);
		return FAILURE;
	}
	return SUCCESS;
}

static int create_mrs(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	int i, j;

	if (user_param->use_odp && user_param->odp_implicit) {
		/* BUG: rdma-local-mr-management -- implicit ODP key handed to the peer */
		ctx->odp_mr = ibv_reg_mr(ctx->pd, NULL, SIZE_MAX, // BUG: rdma-remote-access-overbroad -- implicit ODP with remote read/write exposes the whole address space
					 IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
					 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!ctx->odp_mr) {
			fprintf(stderr, "Couldn't register implicit ODP MR\n");
			return FAILURE;
		}
	}

	for (i = 0; i < user_param->num_of_qps; i++) {
		if (create_single_mr(ctx, user_param, i))
			goto destroy_mr;
	}
	return SUCCESS;

destroy_mr:
	for (j = 0; j < i; j++) {
		ibv_dereg_mr(ctx->mr[j]); // OK: rdma-mr-leak -- the failing iteration released its own buffer; every earlier MR is deregistered
		free(ctx->buf[j]);
	}
	if (ctx->odp_mr)
		ibv_dereg_mr(ctx->odp_mr);
	return FAILURE;
}

int ctx_init(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	int i;

	ctx->pd = ibv_alloc_pd(ctx->context);
	if (!ctx->pd) {
		fprintf(stderr, "Couldn't allocate PD\n");
		return FAILURE;
	}
	if (create_mrs(ctx, user_param))
		goto pd;

	ctx->ctrl_buf = calloc(1, CTRL_SIZE);
	if (!ctx->ctrl_buf)
		goto mrs;
	/* OK: rdma-local-mr-management -- sync messages between iterations; local access only, registered once */
	ctx->ctrl_mr = ibv_reg_mr(ctx->pd, ctx->ctrl_buf, CTRL_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!ctx->ctrl_mr) {
		fprintf(stderr, "Couldn't register control buffer\n");
		goto ctrl;
	}

	if (user_param->cold_cache) {
		ctx->cold_arena = malloc(user_param->cold_arena_size);
		if (!ctx->cold_arena)
			goto ctrl_mr;
	}

	ctx->send_cq = ibv_create_cq(ctx->context, user_param->tx_depth * user_param->num_of_qps,
				     NULL, NULL, 0);
	if (!ctx->send_cq) {
		fprintf(stderr, "Couldn't create CQ\n");
		goto ctrl; // BUG: rdma-mr-leak -- jumps past the ctrl_mr label, so FAILURE is returned with the control MR still registered
	}

	for (i = 0; i < user_param->num_of_qps; i++) {
		struct ibv_qp_init_attr attr = {
			.send_cq = ctx->send_cq,
			.recv_cq = ctx->send_cq,
			.qp_type = IBV_QPT_RC,
			.cap = {
				.max_send_wr = user_param->tx_depth,
				.max_recv_wr = 1,
				.max_send_sge = 1,
				.max_recv_sge = 1,
			},
		};

		ctx->qp[i] = ibv_create_qp(ctx->pd, &attr);
		if (!ctx->qp[i]) {
			fprintf(stderr, "Couldn't create QP[%d]\n", i);
			goto qps;
		}
	}
	return SUCCESS;

qps:
	while (i--)
		ibv_destroy_qp(ctx->qp[i]);
	ibv_destroy_cq(ctx->send_cq);
	free(ctx->cold_arena);
ctrl_mr:
	ibv_dereg_mr(ctx->ctrl_mr);
ctrl:
	free(ctx->ctrl_buf);
mrs:
	for (i = 0; i < user_param->num_of_qps; i++) {
		ibv_dereg_mr(ctx->mr[i]);
		free(ctx->buf[i]);
	}
	if (ctx->odp_mr)
		ibv_dereg_mr(ctx->odp_mr);
pd:
	ibv_dealloc_pd(ctx->pd);
	return FAILURE;
}

int ctx_connect(struct pingpong_context *ctx, struct perftest_parameters *user_param,
		struct pingpong_dest *my_dest, struct pingpong_dest *rem_dest)
{
	int i;

	for (i = 0; i < user_param->num_of_qps; i++) {
		my_dest[i].qpn = ctx->qp[i]->qp_num;
		my_dest[i].psn = lrand48() & 0xffffff;
		my_dest[i].rkey = ctx->odp_mr ? ctx->odp_mr->rkey : ctx->mr[i]->rkey;
		my_dest[i].vaddr = (uintptr_t)ctx->buf[i];
		if (ctx_hand_shake(&my_dest[i], &rem_dest[i])) {
			fprintf(stderr, "Failed to exchange data between server and clients\n");
			return FAILURE;
		}
	}
	return SUCCESS;
}

void ctx_set_send_wqes(struct pingpong_context *ctx, struct perftest_parameters *user_param,
		       struct pingpong_dest *rem_dest)
{
	int i;

	for (i = 0; i < user_param->num_of_qps; i++) {
		memset(&ctx->wr[i], 0, sizeof(ctx->wr[i]));
		ctx->sge_list[i].addr = (uintptr_t)ctx->buf[i];
		ctx->sge_list[i].length = (uint32_t)user_param->size;
		ctx->sge_list[i].lkey = ctx->odp_mr ? ctx->odp_mr->lkey : ctx->mr[i]->lkey;
		ctx->wr[i].sg_list = &ctx->sge_list[i];
		ctx->wr[i].num_sge = 1;
		ctx->wr[i].wr_id = i;
		ctx->wr[i].opcode = user_param->verb == WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
		ctx->wr[i].wr.rdma.remote_addr = rem_dest[i].vaddr;
		ctx->wr[i].wr.rdma.rkey = rem_dest[i].rkey;
	}
}

int run_iter_bw(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	struct ibv_send_wr *bad_wr = NULL;
	struct ibv_mr *arena_mr = NULL;
	struct ibv_wc wc[CQ_MODERATION];
	uint64_t scnt = 0, ccnt = 0;
	size_t nslices = 1;
	int ne, i, ret = SUCCESS;

	if (user_param->cold_cache) {
		nslices = user_param->cold_arena_size / user_param->size;
		/* BUG: rdma-local-mr-management -- the arena's lkey addresses the source of the test's RDMA WRITEs */
		arena_mr = ibv_reg_mr(ctx->pd, ctx->cold_arena, user_param->cold_arena_size, IBV_ACCESS_LOCAL_WRITE); // OK: rdma-registration-in-datapath -- registered once, before the measurement loop
		if (!arena_mr)
			return FAILURE;
		ctx->sge_list[0].lkey = arena_mr->lkey;
	}

	while (scnt < user_param->iters || ccnt < user_param->iters) {
		while (scnt < user_param->iters && scnt - ccnt < (uint64_t)user_param->tx_depth) {
			if (arena_mr)
				ctx->sge_list[0].addr = (uintptr_t)(ctx->cold_arena +
						(scnt % nslices) * user_param->size);
			ctx->wr[0].send_flags = (scnt % CQ_MODERATION == CQ_MODERATION - 1) ?
						IBV_SEND_SIGNALED : 0;
			if (ibv_post_send(ctx->qp[0], &ctx->wr[0], &bad_wr)) {
				fprintf(stderr, "Couldn't post send: scnt=%lu\n", (unsigned long)scnt);
				return FAILURE; // BUG: rdma-mr-leak -- arena_mr is still registered on this early return
			}
			scnt++;
		}
		ne = ibv_poll_cq(ctx->send_cq, CQ_MODERATION, wc);
		if (ne < 0) {
			fprintf(stderr, "poll CQ failed %d\n", ne);
			ret = FAILURE;
			goto cleanup;
		}
		for (i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "Completion with error: %s\n", ibv_wc_status_str(wc[i].status));
				ret = FAILURE;
				goto cleanup;
			}
			ccnt += CQ_MODERATION;
		}
	}

cleanup:
	if (arena_mr)
		ibv_dereg_mr(arena_mr); // OK: rdma-registration-in-datapath, rdma-mr-leak -- released once after the loop, also on the poll error paths
	return ret;
}

int run_iter_lat(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	struct ibv_send_wr wr, *bad_wr = NULL;
	struct ibv_sge sge;
	struct ibv_mr *mr = NULL;
	struct ibv_wc wc;
	size_t nslices = 1;
	uint64_t scnt;
	int ne, ret = SUCCESS;

	if (user_param->cold_cache)
		nslices = user_param->cold_arena_size / user_param->size;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	sge.length = (uint32_t)user_param->size;

	for (scnt = 0; scnt < user_param->iters && ret == SUCCESS; scnt++) {
		if (user_param->cold_cache) {
			char *slice = ctx->cold_arena + (scnt % nslices) * user_param->size;

			/* BUG: rdma-local-mr-management -- a registration per iteration */
			mr = ibv_reg_mr(ctx->pd, slice, user_param->size, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-registration-in-datapath -- each cold slice is registered inside the ping-pong loop
			if (!mr) {
				fprintf(stderr, "Couldn't register slice %lu\n", (unsigned long)scnt);
				return FAILURE;
			}
			sge.addr = (uintptr_t)slice;
			sge.lkey = mr->lkey;
		} else {
			sge.addr = (uintptr_t)ctx->buf[0];
			sge.lkey = ctx->mr[0]->lkey;
		}

		if (ibv_post_send(ctx->qp[0], &wr, &bad_wr)) {
			fprintf(stderr, "Couldn't post send: scnt=%lu\n", (unsigned long)scnt);
			ret = FAILURE; // OK: rdma-mr-leak -- the failed iteration still reaches the deregistration below
		} else {
			do {
				ne = ibv_poll_cq(ctx->send_cq, 1, &wc);
			} while (ne == 0);
			if (ne < 0 || wc.status != IBV_WC_SUCCESS)
				ret = FAILURE;
		}

		if (mr) {
			ibv_dereg_mr(mr); // BUG: rdma-registration-in-datapath -- and deregistered again in the same iteration
			mr = NULL;
		}
	}
	return ret;
}

int destroy_ctx(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	int i, test_result = 0;

	for (i = 0; i < user_param->num_of_qps; i++) {
		if (ibv_destroy_qp(ctx->qp[i]))
			test_result = 1;
	}
	if (ibv_destroy_cq(ctx->send_cq))
		test_result = 1;
	for (i = 0; i < user_param->num_of_qps; i++) {
		if (ibv_dereg_mr(ctx->mr[i]))
			test_result = 1;
		free(ctx->buf[i]);
	}
	if (ctx->odp_mr && ibv_dereg_mr(ctx->odp_mr))
		test_result = 1;
	if (ibv_dereg_mr(ctx->ctrl_mr))
		test_result = 1;
	free(ctx->ctrl_buf);
	free(ctx->cold_arena);
	if (ibv_dealloc_pd(ctx->pd))
		test_result = 1;
	return test_result;
}
