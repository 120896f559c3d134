/*
 * ub_rbench.c - perftest-style RDMA micro-benchmark (ib_write_bw and
 * friends folded into one tool): one context struct holds every handle,
 * ctx_init() builds it and destroy_ctx() unwinds it, the run loops keep
 * tx_depth work requests in flight per QP and signal one in cq_mod.
 *
 * Command-line branches choose the verb (SEND, WRITE, WRITE_IMM, READ,
 * ATOMIC), inline size, signaling interval (cq_mod), tx depth, number of
 * QPs, duplex mode, ODP (explicit or implicit) and --mw, an exposure
 * latency test (memory window bound per iteration, revoked by the client
 * with SEND_WITH_INV).  Buffers and rkeys are exchanged over a TCP side
 * channel (exch_dest(), in the socket helper).
 *
 * Not right: READ tests pick REMOTE_WRITE by testing the transport inline;
 * --odp replaces the access flags and loses LOCAL_WRITE; --odp-implicit
 * registers the whole address space with remote rights; the bandwidth loop
 * tests a "since last signal" counter that nothing advances; a CQ failure
 * skips the deregistration of the control MR; --mw rebinds the window under
 * the same key every iteration and takes any remote invalidation as its own.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define SUCCESS			0
#define FAILURE			1
#define MAX_RECV_RING		4096
#define CTX_POLL_BATCH		16
#define CTRL_SIZE		64
#define DEF_QKEY		0x11111111

enum verb { V_SEND, V_WRITE, V_WRITE_IMM, V_READ, V_ATOMIC };
enum test { T_BW, T_LAT };

struct perftest_params {
	enum verb verb;
	enum test test;
	size_t size;
	int iters, tx_depth, rx_depth, inline_size, cq_mod;
	int num_qps, duplex, use_odp, odp_implicit, use_mw, ib_port;
	int sockfd;
};

struct pingpong_dest {
	uint32_t lid, qpn, psn, rkey;
	uint64_t vaddr;
};

struct pingpong_context {
	struct ibv_context *context;
	struct ibv_device_attr_ex attr;
	struct ibv_pd *pd;
	struct ibv_cq *send_cq, *recv_cq;
	struct ibv_qp **qp;
	struct ibv_mr **mr;
	struct ibv_mw *mw;		/* --mw: window over buf[0] */
	void **buf;
	size_t buf_size;
	void *ctrl_buf;
	struct ibv_mr *ctrl_mr;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	uint64_t *scnt, *ccnt;
	uint32_t since_sig;	/* posts since the last signaled one */
	struct pingpong_dest *rem;
};

/* socket side channel (perftest_communication.c) */
extern int exch_dest(int sockfd, const struct pingpong_dest *my, struct pingpong_dest *rem);
extern int ctx_connect(struct pingpong_context *ctx, int qp_index, struct pingpong_dest *rem);

static int create_single_mr(struct pingpong_context *ctx, struct perftest_params *p, int i)
{
	int flags = IBV_ACCESS_LOCAL_WRITE;
	size_t len = ctx->buf_size;
	void *addr;

	switch (p->verb) {
	case V_WRITE:
	case V_WRITE_IMM:
		flags |= IBV_ACCESS_REMOTE_WRITE;
		break;
	case V_READ:
		flags |= IBV_ACCESS_REMOTE_READ;
		if (ctx->context->device->transport_type == IBV_TRANSPORT_IWARP)
			flags |= IBV_ACCESS_REMOTE_WRITE; // BUG: rdma-access-flags-transport -- the access flags are chosen by an inline iWARP test
		break;
	case V_ATOMIC:
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
		break;
	default:
		break;
	}

	if (p->use_mw)
		flags |= IBV_ACCESS_MW_BIND;
	if (p->use_odp) {
		if (p->use_mw || !(ctx->attr.odp_caps.general_caps & IBV_ODP_SUPPORT)) {
			fprintf(stderr, " ODP not supported (or combined with --mw)\n");
			return FAILURE;
		}
		flags = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE; // BUG: rdma-access-flags-invalid -- '=' drops LOCAL_WRITE: ODP registrations ask for REMOTE_WRITE without it
	}

	ctx->buf[i] = memalign(sysconf(_SC_PAGESIZE), ctx->buf_size);
	if (!ctx->buf[i])
		return FAILURE;
	memset(ctx->buf[i], 0, ctx->buf_size);
	addr = ctx->buf[i];
	if (p->use_odp && p->odp_implicit) {
		addr = NULL;		/* one MR for the whole address space */
		len = SIZE_MAX; // BUG(file): rdma-remote-access-overbroad -- implicit ODP registration with remote read/write
	}
	/* BUG: rdma-local-mr-management -- the test buffer is the local side of the tool's RDMA ops and its rkey goes to the peer */
	ctx->mr[i] = ibv_reg_mr(ctx->pd, addr, len, flags);
	if (!ctx->mr[i]) {
		fprintf(stderr, "Couldn't allocate MR\n");
		free(ctx->buf[i]);
		return FAILURE;
	}
	return SUCCESS;
}

static struct ibv_qp *create_reg_qp(struct pingpong_context *ctx, struct perftest_params *p)
{
	struct ibv_qp_init_attr attr;
	struct ibv_qp *qp;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ctx->send_cq;
	attr.recv_cq = ctx->recv_cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = p->tx_depth;
	if (p->duplex)
		attr.cap.max_send_wr = 2 * p->tx_depth; /* OK: rdma-send-queue-manual-factor -- the factor is for the two directions' data WRs, not for the --mw binds */
	if (p->use_mw)
		attr.cap.max_send_wr = p->tx_depth + 1; /* OK: rdma-send-queue-undersized -- the MW mode is ping-pong: one exposure (BIND + key SEND, or WRITE + SEND_WITH_INV) in flight */
	attr.cap.max_recv_wr = p->verb == V_SEND ? MAX_RECV_RING : 1; /* OK: rdma-queue-cap-unchecked -- 4096 is clamped to max_qp_wr just below */
	if (attr.cap.max_recv_wr > (uint32_t)ctx->attr.orig_attr.max_qp_wr)
		attr.cap.max_recv_wr = ctx->attr.orig_attr.max_qp_wr;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = p->inline_size;

	qp = ibv_create_qp(ctx->pd, &attr);
	if (!qp) {
		fprintf(stderr, "Couldn't create QP: %s\n", strerror(errno));
		return NULL;
	}
	if (p->inline_size > (int)attr.cap.max_inline_data)
		p->inline_size = attr.cap.max_inline_data;
	return qp;
}

static int ctx_alloc_mrs(struct pingpong_context *ctx, struct perftest_params *p)
{
	int i;

	for (i = 0; i < p->num_qps; i++) {
		if (create_single_mr(ctx, p, i))
			goto mr_err;
	}
	return SUCCESS;

mr_err:
	while (i--) {
		ibv_dereg_mr(ctx->mr[i]); /* OK: rdma-mr-leak -- every MR registered before the failure is released */
		free(ctx->buf[i]);
	}
	return FAILURE;
}

static void ctx_free_mrs(struct pingpong_context *ctx, struct perftest_params *p)
{
	int i;

	for (i = 0; i < p->num_qps; i++) {
		ibv_dereg_mr(ctx->mr[i]);
		free(ctx->buf[i]);
	}
}

int ctx_init(struct pingpong_context *ctx, struct perftest_params *p)
{
	int i, cq_depth = p->tx_depth * p->num_qps;

	if (ibv_query_device_ex(ctx->context, NULL, &ctx->attr))
		return FAILURE;
	ctx->qp = calloc(p->num_qps, sizeof(*ctx->qp));
	ctx->mr = calloc(p->num_qps, sizeof(*ctx->mr));
	ctx->buf = calloc(p->num_qps, sizeof(*ctx->buf));
	ctx->wr = calloc(p->num_qps, sizeof(*ctx->wr));
	ctx->sge = calloc(p->num_qps, sizeof(*ctx->sge));
	ctx->scnt = calloc(p->num_qps, sizeof(uint64_t));
	ctx->ccnt = calloc(p->num_qps, sizeof(uint64_t));
	ctx->rem = calloc(p->num_qps, sizeof(*ctx->rem));
	if (!ctx->qp || !ctx->mr || !ctx->buf || !ctx->wr || !ctx->sge ||
	    !ctx->scnt || !ctx->ccnt || !ctx->rem)
		return FAILURE;
	ctx->buf_size = p->size;

	ctx->pd = ibv_alloc_pd(ctx->context);
	if (!ctx->pd)
		return FAILURE;

	if (ctx_alloc_mrs(ctx, p))
		goto pd_err;

	ctx->ctrl_buf = calloc(1, CTRL_SIZE);
	if (!ctx->ctrl_buf)
		goto mr_err;
	/* OK: rdma-local-mr-management -- end-of-test handshake buffer: local access, registered once */
	ctx->ctrl_mr = ibv_reg_mr(ctx->pd, ctx->ctrl_buf, CTRL_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!ctx->ctrl_mr)
		goto ctrl_err;

	ctx->send_cq = ibv_create_cq(ctx->context, cq_depth, NULL, NULL, 0);
	if (!ctx->send_cq)
		goto ctrl_err; // BUG: rdma-mr-leak -- ctrl_err frees the control buffer but never deregisters ctrl_mr
	ctx->recv_cq = ibv_create_cq(ctx->context, p->verb == V_SEND ? MAX_RECV_RING : 1, NULL, NULL, 0);
	if (!ctx->recv_cq)
		goto scq_err;

	for (i = 0; i < p->num_qps; i++) {
		ctx->qp[i] = create_reg_qp(ctx, p);
		if (!ctx->qp[i])
			goto qp_err;
	}
	return SUCCESS;

qp_err:
	while (i--)
		ibv_destroy_qp(ctx->qp[i]);
	ibv_destroy_cq(ctx->recv_cq);
scq_err:
	ibv_destroy_cq(ctx->send_cq);
	ibv_dereg_mr(ctx->ctrl_mr);
ctrl_err:
	free(ctx->ctrl_buf);
mr_err:
	ctx_free_mrs(ctx, p);
pd_err:
	ibv_dealloc_pd(ctx->pd);
	return FAILURE;
}

int ctx_exchange(struct pingpong_context *ctx, struct perftest_params *p)
{
	struct pingpong_dest my;
	int i;

	for (i = 0; i < p->num_qps; i++) {
		memset(&my, 0, sizeof(my));
		my.qpn = ctx->qp[i]->qp_num;
		my.psn = lrand48() & 0xffffff;
		my.rkey = ctx->mr[i]->rkey; /* OK: rdma-remote-access-overbroad -- the peer's RDMA ops use the buffer's remote rights with this key */
		my.vaddr = (uintptr_t)ctx->buf[i];
		if (exch_dest(p->sockfd, &my, &ctx->rem[i]) || ctx_connect(ctx, i, &ctx->rem[i]))
			return FAILURE;
	}
	return SUCCESS;
}

static void ctx_set_send_wqes(struct pingpong_context *ctx, struct perftest_params *p)
{
	int i;

	for (i = 0; i < p->num_qps; i++) {
		ctx->sge[i].addr = (uintptr_t)ctx->buf[i];
		ctx->sge[i].length = p->size;
		ctx->sge[i].lkey = ctx->mr[i]->lkey;
		memset(&ctx->wr[i], 0, sizeof(ctx->wr[i]));
		ctx->wr[i].wr_id = i;
		ctx->wr[i].sg_list = &ctx->sge[i];
		ctx->wr[i].num_sge = 1;
		switch (p->verb) {
		case V_SEND:      ctx->wr[i].opcode = IBV_WR_SEND; break;
		case V_WRITE:     ctx->wr[i].opcode = IBV_WR_RDMA_WRITE; break;
		case V_WRITE_IMM: ctx->wr[i].opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
		case V_READ:      ctx->wr[i].opcode = IBV_WR_RDMA_READ; break;
		case V_ATOMIC:    ctx->wr[i].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD; break;
		}
		if (p->verb == V_ATOMIC) {
			ctx->sge[i].length = 8;
			ctx->wr[i].wr.atomic.remote_addr = ctx->rem[i].vaddr;
			ctx->wr[i].wr.atomic.rkey = ctx->rem[i].rkey;
			ctx->wr[i].wr.atomic.compare_add = 1;
		} else {
			ctx->wr[i].wr.rdma.remote_addr = ctx->rem[i].vaddr;
			ctx->wr[i].wr.rdma.rkey = ctx->rem[i].rkey;
		}
		if (p->size <= (size_t)p->inline_size && p->verb != V_READ && p->verb != V_ATOMIC)
			ctx->wr[i].send_flags |= IBV_SEND_INLINE;
	}
}

int run_iter_bw(struct pingpong_context *ctx, struct perftest_params *p)
{
	struct ibv_wc wc[CTX_POLL_BATCH];
	struct ibv_send_wr *bad;
	uint64_t totscnt = 0, totccnt = 0, target = (uint64_t)p->iters * p->num_qps;
	int i, ne;

	ctx_set_send_wqes(ctx, p);
	while (totscnt < target || totccnt < target) {
		for (i = 0; i < p->num_qps; i++) {
			while (ctx->scnt[i] < (uint64_t)p->iters &&
			       ctx->scnt[i] - ctx->ccnt[i] < (uint64_t)p->tx_depth) {
				if (ctx->since_sig == (uint32_t)p->cq_mod - 1) { // BUG(file): rdma-unsignaled-send-starvation -- since_sig is reset but never incremented; with cq_mod > 1 no WR is ever signaled
					ctx->wr[i].send_flags |= IBV_SEND_SIGNALED;
					ctx->since_sig = 0;
				} else {
					ctx->wr[i].send_flags &= ~IBV_SEND_SIGNALED;
				}
				if (ibv_post_send(ctx->qp[i], &ctx->wr[i], &bad)) {
					fprintf(stderr, "Couldn't post send: qp %d scnt=%lu\n",
						i, (unsigned long)ctx->scnt[i]);
					return FAILURE;
				}
				ctx->scnt[i]++;
				totscnt++;
			}
		}
		ne = ibv_poll_cq(ctx->send_cq, CTX_POLL_BATCH, wc);
		if (ne < 0)
			return FAILURE;
		for (i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "Completion with error: %s\n",
					ibv_wc_status_str(wc[i].status));
				return FAILURE;
			}
			ctx->ccnt[wc[i].wr_id] += p->cq_mod;
			totccnt += p->cq_mod;
		}
	}
	return SUCCESS;
}

/*
 * --mw: exposure latency.  Each iteration the server binds a type-2 window
 * over its buffer and sends the rkey; the client RDMA-WRITEs the message and
 * revokes the window with SEND_WITH_INV.
 */
int run_iter_mw_server(struct pingpong_context *ctx, struct perftest_params *p)
{
	struct ibv_sge key_sge = { (uintptr_t)ctx->ctrl_buf, sizeof(uint32_t), ctx->ctrl_mr->lkey };
	struct ibv_send_wr bind_wr, key_wr, *bad;
	struct ibv_recv_wr rwr = { .num_sge = 0 }, *rbad;
	struct ibv_wc wc;
	int it, ne;

	if (!ctx->mw) {
		ctx->mw = ibv_alloc_mw(ctx->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- the tool exposes its buffer through a window it manages itself
		if (!ctx->mw)
			return FAILURE;
	}
	for (it = 0; it < p->iters; it++) {
		memset(&bind_wr, 0, sizeof(bind_wr));
		bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-iteration window bind
		bind_wr.bind_mw.mw = ctx->mw;
		bind_wr.bind_mw.rkey = ctx->mw->rkey; // BUG: rdma-rkey-reuse -- every iteration exposes the buffer again under the key the client already used
		bind_wr.bind_mw.bind_info.mr = ctx->mr[0];
		bind_wr.bind_mw.bind_info.addr = (uintptr_t)ctx->buf[0];
		bind_wr.bind_mw.bind_info.length = p->size;
		bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- the MW mode refuses ODP, so mr[0] has LOCAL_WRITE and MW_BIND */
		bind_wr.next = &key_wr;
		*(uint32_t *)ctx->ctrl_buf = ctx->mw->rkey;
		memset(&key_wr, 0, sizeof(key_wr));
		key_wr.sg_list = &key_sge;
		key_wr.num_sge = 1;
		key_wr.opcode = IBV_WR_SEND;
		key_wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		if (ibv_post_recv(ctx->qp[0], &rwr, &rbad) || ibv_post_send(ctx->qp[0], &bind_wr, &bad))
			return FAILURE;
		do {
			ne = ibv_poll_cq(ctx->recv_cq, 1, &wc);	/* the client's revoke */
		} while (ne == 0);
		if (ne < 0 || wc.status != IBV_WC_SUCCESS)
			return FAILURE;
		if (wc.wc_flags & IBV_WC_WITH_INV) {
			ctx->scnt[0]++; // BUG: rdma-remote-invalidate-unchecked -- any invalidated key counts as this window's revoke
		} else {
			fprintf(stderr, "iteration %d: window was not revoked\n", it);
			return FAILURE;
		}
		do {
			ne = ibv_poll_cq(ctx->send_cq, 1, &wc);	/* the key SEND */
		} while (ne == 0);
	}
	return SUCCESS;
}

int run_iter_mw_client(struct pingpong_context *ctx, struct perftest_params *p)
{
	struct ibv_sge key_sge = { (uintptr_t)ctx->ctrl_buf, sizeof(uint32_t), ctx->ctrl_mr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &key_sge, .num_sge = 1 }, *rbad;
	struct ibv_send_wr inv_wr = { .opcode = IBV_WR_SEND_WITH_INV,
				      .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	int it, ne;

	ctx_set_send_wqes(ctx, p);
	ctx->wr[0].next = &inv_wr;	/* RDMA WRITE, then revoke */
	for (it = 0; it < p->iters; it++) {
		if (ibv_post_recv(ctx->qp[0], &rwr, &rbad))
			return FAILURE;
		do {
			ne = ibv_poll_cq(ctx->recv_cq, 1, &wc);
		} while (ne == 0);
		if (ne < 0 || wc.status != IBV_WC_SUCCESS)
			return FAILURE;
		ctx->wr[0].wr.rdma.rkey = *(uint32_t *)ctx->ctrl_buf;
		inv_wr.invalidate_rkey = ctx->wr[0].wr.rdma.rkey;
		if (ibv_post_send(ctx->qp[0], &ctx->wr[0], &bad))
			return FAILURE;
		do {
			ne = ibv_poll_cq(ctx->send_cq, 1, &wc);
		} while (ne == 0);
	}
	return SUCCESS;
}

/* end of test: tell the peer we are done (it posted a receive in ctx_connect) */
int ctx_sync_end(struct pingpong_context *ctx)
{
	struct ibv_sge sge = { (uintptr_t)ctx->ctrl_buf, CTRL_SIZE, ctx->ctrl_mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	int ne;

	strcpy(ctx->ctrl_buf, "done");
	if (ibv_post_send(ctx->qp[0], &wr, &bad))
		return FAILURE;
	do {
		ne = ibv_poll_cq(ctx->send_cq, 1, &wc);
	} while (ne == 0);
	return (ne < 0 || wc.status != IBV_WC_SUCCESS) ? FAILURE : SUCCESS;
}

int destroy_ctx(struct pingpong_context *ctx, struct perftest_params *p)
{
	int i, ret = SUCCESS;

	for (i = 0; i < p->num_qps; i++) {
		if (ibv_destroy_qp(ctx->qp[i]))
			ret = FAILURE;
	}
	if (ctx->mw)
		ibv_dealloc_mw(ctx->mw);
	for (i = 0; i < p->num_qps; i++) {
		if (ibv_dereg_mr(ctx->mr[i])) {
			fprintf(stderr, "Failed to deregister MR #%d\n", i);
			ret = FAILURE;
			continue;	/* the MR still maps the pages: keep them */
		}
		free(ctx->buf[i]); /* OK: rdma-invalidation-leak -- the buffer goes back after its MR was deregistered */
	}
	ibv_dereg_mr(ctx->ctrl_mr);
	free(ctx->ctrl_buf);
	ibv_destroy_cq(ctx->send_cq);
	ibv_destroy_cq(ctx->recv_cq);
	ibv_dealloc_pd(ctx->pd);
	free(ctx->qp);
	free(ctx->mr);
	free(ctx->buf);
	free(ctx->wr);
	free(ctx->sge);
	free(ctx->scnt);
	free(ctx->ccnt);
	free(ctx->rem);
	return ret;
}
