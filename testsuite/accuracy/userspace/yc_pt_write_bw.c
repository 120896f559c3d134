/*
 * pt_write_bw.c - multi-threaded RDMA WRITE bandwidth / latency test in the
 * spirit of perftest.
 *
 * Each worker thread owns an RC QP and a CQ towards the same peer; a control
 * QP carries the per-interval report exchange (the peer answers each report
 * with its own numbers).  Out-of-band setup (QP numbers, buffer address and
 * rkey) goes over a TCP socket, see pt_oob.c.
 *
 * Bandwidth mode posts lists of post_list WRITEs linked through
 * th->wr[i].next, asks for a completion every SIGNAL_EVERY work requests and
 * keeps scnt - ccnt within TX_DEPTH.  Latency mode writes one inline
 * message per iteration and spins on the peer's echo.
 *
 * What is wrong here:
 *  - latency mode keeps its "unsignaled" count in a local that restarts at
 *    zero on every call, so it never signals and the data QP fills after
 *    TX_DEPTH iterations;
 *  - report messages on the control QP never ask for a completion;
 *  - the data QP asks for TX_DEPTH work requests and INLINE_SIZE bytes of
 *    inline data without checking either against the device (only the SGE
 *    count is clamped).
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-registration-in-datapath,
 *   rdma-local-mr-management, rdma-invalidation-leak,
 *   rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked,
 *   rdma-send-queue-manual-factor -- not covered by this file's annotations
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define MAX_THREADS	16
#define TX_DEPTH	2048
#define RX_DEPTH	512
#define CTRL_DEPTH	16
#define SIGNAL_EVERY	64
#define MAX_POST_LIST	32
#define MAX_SEND_SGE	16
#define INLINE_SIZE	236
#define CTRL_MSG_SIZE	64
#define DEF_ITERS	(100 * SIGNAL_EVERY * MAX_POST_LIST)
#define DEF_SIZE	65536

#define CHECK(cond, msg) do { if (cond) { perror(msg); exit(1); } } while (0)

struct pt_params {
	int		threads;
	int		post_list;
	uint64_t	iters;
	size_t		size;
	int		lat_mode;
	int		duration;	/* seconds, bandwidth mode reports once a second */
	const char	*dev_name;
	const char	*server;
};

struct pt_remote {
	uint64_t	addr;
	uint32_t	rkey;
	uint32_t	qpn;
	uint32_t	psn;
	uint16_t	lid;
};

struct pt_report {
	uint32_t	thread;
	uint32_t	second;
	uint64_t	bytes;
};

struct pt_ctx;

struct pt_thread {
	int			id;
	pthread_t		tid;
	struct pt_ctx		*ctx;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_mr		*mr;
	char			*buf;
	struct ibv_send_wr	wr[MAX_POST_LIST];
	struct ibv_sge		sge[MAX_POST_LIST];
	uint64_t		scnt;
	uint64_t		ccnt;
	uint64_t		posted;
	struct pt_remote	rem;
};

struct pt_ctx {
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	struct ibv_device_attr	attr;
	struct pt_params	p;
	struct pt_thread	th[MAX_THREADS];
	struct ibv_cq		*ctrl_cq;
	struct ibv_qp		*ctrl_qp;
	struct ibv_mr		*ctrl_mr;
	char			*ctrl_buf;
	volatile int		stop;
};

/* pt_oob.c */
int pt_oob_exchange(struct pt_ctx *ctx, const char *server);
int pt_connect_qp(struct ibv_qp *qp, const struct pt_remote *rem);

static void pt_open_device(struct pt_ctx *ctx)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	int i;

	CHECK(!list, "ibv_get_device_list");
	for (i = 0; list[i]; i++)
		if (!ctx->p.dev_name || !strcmp(ibv_get_device_name(list[i]), ctx->p.dev_name))
			break;
	CHECK(!list[i], "no such device");
	ctx->verbs = ibv_open_device(list[i]);
	CHECK(!ctx->verbs, "ibv_open_device");
	ibv_free_device_list(list);
	CHECK(ibv_query_device(ctx->verbs, &ctx->attr), "ibv_query_device");
	ctx->pd = ibv_alloc_pd(ctx->verbs);
	CHECK(!ctx->pd, "ibv_alloc_pd");
}

static void pt_create_data_qp(struct pt_ctx *ctx, struct pt_thread *th)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = th->cq;
	attr.recv_cq = th->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = TX_DEPTH; /* BUG: rdma-queue-cap-unchecked -- 2048 work requests, never compared with max_qp_wr */
	attr.cap.max_recv_wr = RX_DEPTH;
	attr.cap.max_send_sge = MAX_SEND_SGE > ctx->attr.max_sge ? ctx->attr.max_sge : MAX_SEND_SGE; /* OK: rdma-queue-cap-unchecked -- clamped to the device's max_sge */
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = INLINE_SIZE; /* BUG: rdma-queue-cap-unchecked -- 236 inline bytes requested with no fallback and no check */

	th->qp = ibv_create_qp(ctx->pd, &attr);
	CHECK(!th->qp, "ibv_create_qp(data)");
}

static void pt_create_ctrl_qp(struct pt_ctx *ctx)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
		.cap = {
			.max_send_wr	 = CTRL_DEPTH,
			.max_recv_wr	 = CTRL_DEPTH,
			.max_send_sge	 = 1,
			.max_recv_sge	 = 1,
			.max_inline_data = CTRL_MSG_SIZE, /* OK: rdma-queue-cap-unchecked -- 64 bytes is within what every device accepts */
		},
	};

	ctx->ctrl_cq = ibv_create_cq(ctx->verbs, 2 * CTRL_DEPTH, NULL, NULL, 0);
	CHECK(!ctx->ctrl_cq, "ibv_create_cq(ctrl)");
	attr.send_cq = attr.recv_cq = ctx->ctrl_cq;
	ctx->ctrl_qp = ibv_create_qp(ctx->pd, &attr);
	CHECK(!ctx->ctrl_qp, "ibv_create_qp(ctrl)");
	ctx->ctrl_buf = calloc(2, CTRL_MSG_SIZE);
	ctx->ctrl_mr = ibv_reg_mr(ctx->pd, ctx->ctrl_buf, 2 * CTRL_MSG_SIZE,
				  IBV_ACCESS_LOCAL_WRITE);
	CHECK(!ctx->ctrl_mr, "ibv_reg_mr(ctrl)");
}

static int pt_ctrl_post_recv(struct pt_ctx *ctx)
{
	struct ibv_sge sge = {
		(uintptr_t)ctx->ctrl_buf + CTRL_MSG_SIZE, CTRL_MSG_SIZE, ctx->ctrl_mr->lkey
	};
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(ctx->ctrl_qp, &wr, &bad);
}

/* Send one report and wait for the peer's answer. */
static int pt_ctrl_exchange(struct pt_ctx *ctx, const struct pt_report *out,
			    struct pt_report *in)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)ctx->ctrl_buf, .length = sizeof(*out),
		.lkey = ctx->ctrl_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = 0, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE, /* BUG(file): rdma-unsignaled-send-starvation -- nothing on the control QP asks for a completion; after CTRL_DEPTH reports its send queue is full */
	};
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	int n;

	memcpy(ctx->ctrl_buf, out, sizeof(*out));
	if (pt_ctrl_post_recv(ctx) || ibv_post_send(ctx->ctrl_qp, &wr, &bad))
		return -1;
	do {
		n = ibv_poll_cq(ctx->ctrl_cq, 1, &wc);
	} while (n == 0);
	if (n < 0 || wc.status != IBV_WC_SUCCESS || !(wc.opcode & IBV_WC_RECV))
		return -1;
	memcpy(in, ctx->ctrl_buf + CTRL_MSG_SIZE, sizeof(*in));
	return 0;
}

static void pt_init_wr_list(struct pt_thread *th)
{
	struct pt_params *p = &th->ctx->p;
	int i;

	for (i = 0; i < p->post_list; i++) {
		th->sge[i].addr = (uintptr_t)th->buf;
		th->sge[i].length = p->size;
		th->sge[i].lkey = th->mr->lkey;
		th->wr[i].wr_id = th->id;
		th->wr[i].sg_list = &th->sge[i];
		th->wr[i].num_sge = 1;
		th->wr[i].opcode = IBV_WR_RDMA_WRITE;
		th->wr[i].wr.rdma.remote_addr = th->rem.addr;
		th->wr[i].wr.rdma.rkey = th->rem.rkey;
		th->wr[i].next = (i == p->post_list - 1) ? NULL : &th->wr[i + 1];
	}
}

static int pt_bw_post(struct pt_thread *th)
{
	struct pt_params *p = &th->ctx->p;
	struct ibv_send_wr *bad;
	int i;

	for (i = 0; i < p->post_list; i++) {
		th->wr[i].send_flags = p->size <= INLINE_SIZE ? IBV_SEND_INLINE : 0;
		if (++th->posted % SIGNAL_EVERY == 0) /* OK: rdma-unsignaled-send-starvation -- posted advances on every WRITE, every SIGNAL_EVERY-th is signaled */
			th->wr[i].send_flags |= IBV_SEND_SIGNALED;
	}
	return ibv_post_send(th->qp, &th->wr[0], &bad);
}

static int pt_run_bw(struct pt_thread *th)
{
	struct pt_params *p = &th->ctx->p;
	struct ibv_wc wc[16];
	int n, i;

	while (th->ccnt < p->iters && !th->ctx->stop) {
		while (th->scnt < p->iters &&
		       th->scnt - th->ccnt + p->post_list <= TX_DEPTH) { /* OK: rdma-send-queue-undersized -- unreaped WRITEs are kept within the TX_DEPTH the QP was created with */
			if (pt_bw_post(th))
				return -1;
			th->scnt += p->post_list;
		}
		n = ibv_poll_cq(th->cq, 16, wc);
		if (n < 0)
			return -1;
		for (i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "thread %d: %s\n", th->id,
					ibv_wc_status_str(wc[i].status));
				return -1;
			}
			th->ccnt += SIGNAL_EVERY;
		}
	}
	return 0;
}

static int pt_lat_iter(struct pt_thread *th, uint64_t iter)
{
	struct pt_params *p = &th->ctx->p;
	volatile uint64_t *echo = (volatile uint64_t *)(th->buf + p->size - sizeof(uint64_t));
	struct ibv_send_wr *wr = &th->wr[0], *bad;
	unsigned int unsignaled = 0;

	wr->next = NULL;
	wr->send_flags = p->size <= INLINE_SIZE ? IBV_SEND_INLINE : 0;
	if (++unsignaled == SIGNAL_EVERY) { /* BUG(file): rdma-unsignaled-send-starvation -- the local restarts at zero on each call and never reaches SIGNAL_EVERY; in latency mode no WRITE is ever signaled */
		wr->send_flags |= IBV_SEND_SIGNALED;
		unsignaled = 0;
	}
	*(uint64_t *)th->buf = iter;
	if (ibv_post_send(th->qp, wr, &bad))
		return -1;
	while (*echo != iter && !th->ctx->stop)
		;
	return 0;
}

static void *pt_worker(void *arg)
{
	struct pt_thread *th = arg;
	struct pt_params *p = &th->ctx->p;
	uint64_t i;

	if (p->lat_mode) {
		for (i = 1; i <= p->iters; i++)
			if (pt_lat_iter(th, i))
				break;
	} else {
		pt_run_bw(th);
	}
	return NULL;
}

static void pt_setup_thread(struct pt_ctx *ctx, int id)
{
	struct pt_thread *th = &ctx->th[id];

	th->id = id;
	th->ctx = ctx;
	th->cq = ibv_create_cq(ctx->verbs, TX_DEPTH / SIGNAL_EVERY + RX_DEPTH, NULL, NULL, 0);
	CHECK(!th->cq, "ibv_create_cq");
	th->buf = aligned_alloc(4096, ctx->p.size);
	CHECK(!th->buf, "aligned_alloc");
	memset(th->buf, 0, ctx->p.size);
	th->mr = ibv_reg_mr(ctx->pd, th->buf, ctx->p.size,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(!th->mr, "ibv_reg_mr");
	pt_create_data_qp(ctx, th);
}

int main(int argc, char **argv)
{
	static struct pt_ctx ctx;
	struct pt_report out, in;
	int opt, i, sec;

	ctx.p.threads = 1;
	ctx.p.post_list = 1;
	ctx.p.iters = DEF_ITERS;
	ctx.p.size = DEF_SIZE;
	while ((opt = getopt(argc, argv, "d:t:l:n:s:D:L")) != -1) {
		switch (opt) {
		case 'd': ctx.p.dev_name = optarg; break;
		case 't': ctx.p.threads = atoi(optarg); break;
		case 'l': ctx.p.post_list = atoi(optarg); break;
		case 'n': ctx.p.iters = strtoull(optarg, NULL, 0); break;
		case 's': ctx.p.size = strtoul(optarg, NULL, 0); break;
		case 'D': ctx.p.duration = atoi(optarg); break;
		case 'L': ctx.p.lat_mode = 1; break;
		default: return 1;
		}
	}
	ctx.p.server = optind < argc ? argv[optind] : NULL;
	if (ctx.p.threads < 1 || ctx.p.threads > MAX_THREADS ||
	    ctx.p.post_list < 1 || ctx.p.post_list > MAX_POST_LIST ||
	    SIGNAL_EVERY % ctx.p.post_list || ctx.p.size < sizeof(uint64_t) * 2) {
		fprintf(stderr, "bad parameters\n");
		return 1;
	}
	/* every signaled completion stands for SIGNAL_EVERY writes */
	ctx.p.iters = (ctx.p.iters + SIGNAL_EVERY - 1) / SIGNAL_EVERY * SIGNAL_EVERY;

	pt_open_device(&ctx);
	pt_create_ctrl_qp(&ctx);
	for (i = 0; i < ctx.p.threads; i++)
		pt_setup_thread(&ctx, i);
	CHECK(pt_oob_exchange(&ctx, ctx.p.server), "pt_oob_exchange");
	for (i = 0; i < ctx.p.threads; i++) {
		CHECK(pt_connect_qp(ctx.th[i].qp, &ctx.th[i].rem), "connect data qp");
		pt_init_wr_list(&ctx.th[i]);
		pthread_create(&ctx.th[i].tid, NULL, pt_worker, &ctx.th[i]);
	}

	for (sec = 0; sec < ctx.p.duration; sec++) {
		sleep(1);
		for (i = 0; i < ctx.p.threads; i++) {
			out.thread = i;
			out.second = sec;
			out.bytes = ctx.th[i].ccnt * ctx.p.size;
			if (pt_ctrl_exchange(&ctx, &out, &in))
				fprintf(stderr, "report exchange failed\n");
			else
				printf("%2d t%-2d local %12llu B peer %12llu B\n", sec, i,
				       (unsigned long long)out.bytes,
				       (unsigned long long)in.bytes);
		}
	}
	if (ctx.p.duration)
		ctx.stop = 1;
	for (i = 0; i < ctx.p.threads; i++)
		pthread_join(ctx.th[i].tid, NULL);
	return 0;
}
