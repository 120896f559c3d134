/*
 * wb_perf_write_bw.c - RDMA WRITE / fetch-and-add bandwidth benchmark,
 * in the style of perftest's ib_write_bw / ib_atomic_bw.
 *
 * One process per side; the client drives N RC data QPs with lists of
 * post_list work requests and asks for a completion on every cq_mod-th
 * list; the server only exposes its buffer.  A second RC QP ("sync")
 * carries per-round reports between the two sides.  Queue depths come
 * from the command line and are clamped to the device limits.
 *
 * Known problems kept here on purpose: the sync QP never asks for a
 * completion and wants more inline data than some devices offer; the
 * atomic result buffer and the sync buffer grant remote rights nobody
 * uses; the implicit-ODP mode hands the peer a key for the whole address
 * space.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-rkey-reuse, rdma-unmap-before-invalidate, rdma-local-mr-management, rdma-send-queue-manual-factor -- not reviewed for this benchmark
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <getopt.h>
#include <unistd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>

#define MAX_QPS		16
#define MAX_POST_LIST	32
#define MAX_SEND_SGE	8
#define DEF_TX_DEPTH	128
#define DEF_CQ_MOD	16
#define DEF_INLINE	220
#define SYNC_DEPTH	16
#define SYNC_MSG_INLINE	256
#define SYNC_BUF_SZ	4096
#define SYNC_MSG_SZ	64
#define WC_BATCH	64

#define WRID(q, n)	(((uint64_t)(n) << 8) | (uint64_t)(q))
#define WRID_QP(id)	((int)((id) & 0xff))
#define WRID_CNT(id)	((uint32_t)((id) >> 8))

enum bench_verb { VERB_WRITE, VERB_ATOMIC };

struct bench_cfg {
	const char	*ib_devname;
	const char	*servername;
	const char	*port;
	int		 ib_port;
	enum bench_verb	 verb;
	int		 num_qps;
	unsigned	 tx_depth;
	unsigned	 post_list;
	unsigned	 cq_mod;
	unsigned	 num_sge;
	unsigned	 inline_size;
	size_t		 size;
	uint64_t	 iters;
	int		 rounds;
	int		 odp;
	int		 odp_implicit;
};

struct bench_dest {
	uint32_t	qpn[MAX_QPS];
	uint32_t	sync_qpn;
	uint32_t	psn;
	uint32_t	rkey;
	uint64_t	vaddr;
	uint16_t	lid;
};

struct bench_ctx {
	struct ibv_context	*context;
	struct ibv_device_attr	 dev_attr;
	struct ibv_pd		*pd;
	struct ibv_cq		*send_cq;
	struct ibv_cq		*sync_cq;
	struct ibv_qp		*qp[MAX_QPS];
	struct ibv_qp		*sync_qp;
	struct ibv_mr		*mr;
	struct ibv_mr		*res_mr;
	struct ibv_mr		*sync_mr;
	void			*buf;
	size_t			 buf_size;
	uint64_t		*res_buf;
	char			*sync_buf;
	unsigned		 max_inline;
	struct ibv_send_wr	 wr[MAX_QPS][MAX_POST_LIST];
	struct ibv_sge		 sge[MAX_QPS][MAX_POST_LIST][MAX_SEND_SGE];
	uint64_t		 scnt[MAX_QPS];
	uint64_t		 ccnt[MAX_QPS];
	unsigned		 lists_since_sig[MAX_QPS];
	struct bench_dest	 rem;
};

static int bench_access(const struct bench_cfg *cfg)
{
	int acc;

	acc = cfg->verb == VERB_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC
				       : IBV_ACCESS_REMOTE_WRITE;
	if (cfg->odp)
		acc |= IBV_ACCESS_ON_DEMAND;
	/* fetch-add results and loopback runs land in this buffer too */
	acc |= IBV_ACCESS_LOCAL_WRITE;
	return acc;
}

static void check_limits(struct bench_ctx *ctx, struct bench_cfg *cfg)
{
	if (cfg->tx_depth > (unsigned)ctx->dev_attr.max_qp_wr)
		cfg->tx_depth = ctx->dev_attr.max_qp_wr;
	if (cfg->post_list == 0 || cfg->post_list > MAX_POST_LIST)
		cfg->post_list = 1;
	if (cfg->post_list > cfg->tx_depth)
		cfg->post_list = cfg->tx_depth;
	if (cfg->cq_mod == 0)
		cfg->cq_mod = 1;
	if (cfg->cq_mod * cfg->post_list > cfg->tx_depth)
		cfg->cq_mod = cfg->tx_depth / cfg->post_list;
	if (cfg->num_sge == 0 || cfg->num_sge > MAX_SEND_SGE)
		cfg->num_sge = 1;
	cfg->iters -= cfg->iters % cfg->post_list;
}

static int alloc_buffers(struct bench_ctx *ctx, const struct bench_cfg *cfg)
{
	size_t res_len = sizeof(uint64_t) * MAX_QPS;

	ctx->buf_size = cfg->size * cfg->num_qps;
	if (posix_memalign(&ctx->buf, sysconf(_SC_PAGESIZE), ctx->buf_size))
		return -ENOMEM;
	memset(ctx->buf, 0, ctx->buf_size);

	if (cfg->odp_implicit)
		/* BUG: rdma-remote-access-overbroad -- implicit ODP MR with remote rights: the rkey sent to the peer covers the whole address space */
		ctx->mr = ibv_reg_mr(ctx->pd, NULL, SIZE_MAX, bench_access(cfg) | IBV_ACCESS_ON_DEMAND);
	else
		/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad, rdma-registration-in-datapath -- LOCAL_WRITE is always added, the rkey goes to the peer in exch_dest, registered once before the measurement */
		ctx->mr = ibv_reg_mr(ctx->pd, ctx->buf, ctx->buf_size, bench_access(cfg));
	if (!ctx->mr) {
		fprintf(stderr, "ibv_reg_mr(data): %s\n", strerror(errno));
		goto err_buf;
	}

	if (cfg->verb != VERB_ATOMIC)
		return 0;

	ctx->res_buf = calloc(MAX_QPS, sizeof(uint64_t));
	if (!ctx->res_buf)
		goto err_mr;
	/* BUG: rdma-remote-access-overbroad -- only res_mr->lkey is ever used; no peer gets this rkey */
	ctx->res_mr = ibv_reg_mr(ctx->pd, ctx->res_buf, res_len, IBV_ACCESS_REMOTE_ATOMIC); /* BUG: rdma-access-flags-invalid -- REMOTE_ATOMIC without LOCAL_WRITE, fails with EINVAL */
	if (!ctx->res_mr)
		goto err_res;
	return 0;

err_res:
	free(ctx->res_buf);
err_mr:
	ibv_dereg_mr(ctx->mr);
err_buf:
	free(ctx->buf);
	return -1;
}

static int create_data_qps(struct bench_ctx *ctx, struct bench_cfg *cfg)
{
	struct ibv_qp_init_attr attr;
	int i;

	for (i = 0; i < cfg->num_qps; i++) {
		memset(&attr, 0, sizeof(attr));
		attr.send_cq = ctx->send_cq;
		attr.recv_cq = ctx->send_cq;
		attr.qp_type = IBV_QPT_RC;
		attr.sq_sig_all = 0;
		/* OK: rdma-send-queue-undersized -- a post list of post_list WRs is posted only while scnt - ccnt + post_list <= tx_depth */
		attr.cap.max_send_wr = cfg->tx_depth;
		attr.cap.max_recv_wr = 1;
		attr.cap.max_send_sge = MAX_SEND_SGE; /* OK: rdma-queue-cap-unchecked -- 8 SGEs, clamped to the device's max_sge just below */
		if (attr.cap.max_send_sge > (uint32_t)ctx->dev_attr.max_sge)
			attr.cap.max_send_sge = ctx->dev_attr.max_sge;
		attr.cap.max_recv_sge = 1;
		attr.cap.max_inline_data = DEF_INLINE; /* OK: rdma-queue-cap-unchecked -- granted value read back below */

		ctx->qp[i] = ibv_create_qp(ctx->pd, &attr);
		if (!ctx->qp[i]) {
			fprintf(stderr, "ibv_create_qp(%d): %s\n", i, strerror(errno));
			goto unwind;
		}
		if (i == 0)
			ctx->max_inline = attr.cap.max_inline_data;
	}
	if (cfg->inline_size > ctx->max_inline)
		cfg->inline_size = ctx->max_inline;
	if (cfg->num_sge > attr.cap.max_send_sge)
		cfg->num_sge = attr.cap.max_send_sge;
	return 0;

unwind:
	while (--i >= 0)
		ibv_destroy_qp(ctx->qp[i]);
	return -1;
}

static int create_sync_qp(struct bench_ctx *ctx)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = ctx->sync_cq,
		.recv_cq = ctx->sync_cq,
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = SYNC_DEPTH,
			.max_recv_wr = SYNC_DEPTH,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			/* BUG(file): rdma-queue-cap-unchecked -- 256 bytes of inline data, never compared with what the device grants */
			.max_inline_data = SYNC_MSG_INLINE,
		},
	};

	/* BUG(file): rdma-unsignaled-send-starvation -- sq_sig_all is 0 and sync_send() never sets IBV_SEND_SIGNALED; the sync SQ fills after SYNC_DEPTH rounds */
	ctx->sync_qp = ibv_create_qp(ctx->pd, &attr);
	return ctx->sync_qp ? 0 : -1;
}

static int sync_post_recv(struct bench_ctx *ctx, int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(ctx->sync_buf + slot * SYNC_MSG_SZ),
		.length = SYNC_MSG_SZ,
		.lkey = ctx->sync_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(ctx->sync_qp, &wr, &bad);
}

static int sync_send(struct bench_ctx *ctx, const char *fmt, int round)
{
	char *msg = ctx->sync_buf + SYNC_BUF_SZ / 2;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	snprintf(msg, SYNC_MSG_SZ, fmt, round);
	sge.addr = (uintptr_t)msg;
	sge.length = strlen(msg) + 1;
	sge.lkey = ctx->sync_mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_INLINE;	/* tiny, no need to wait for it */
	return ibv_post_send(ctx->sync_qp, &wr, &bad);
}

static int sync_wait(struct bench_ctx *ctx)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(ctx->sync_cq, 1, &wc);
	} while (n == 0);
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -1;
	return sync_post_recv(ctx, (int)wc.wr_id);
}

static int sync_init(struct bench_ctx *ctx)
{
	int i;

	ctx->sync_buf = calloc(1, SYNC_BUF_SZ);
	if (!ctx->sync_buf)
		return -ENOMEM;
	/* BUG: rdma-remote-access-overbroad -- REMOTE_WRITE "for a later write-based barrier"; sync_mr->rkey is never sent */
	ctx->sync_mr = ibv_reg_mr(ctx->pd, ctx->sync_buf, SYNC_BUF_SZ, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-registration-in-datapath -- memory this setup function allocated, before the hello message */
	if (!ctx->sync_mr) {
		free(ctx->sync_buf);
		return -1;
	}
	for (i = 0; i < SYNC_DEPTH / 2; i++)
		if (sync_post_recv(ctx, i))
			return -1;
	if (sync_send(ctx, "HELLO %d", 0))
		return -1;
	return sync_wait(ctx);
}

static int run_iter_bw(struct bench_ctx *ctx, const struct bench_cfg *cfg)
{
	struct ibv_wc wc[WC_BATCH];
	struct ibv_send_wr *bad;
	uint64_t want = cfg->iters * cfg->num_qps, done = 0;
	int q, i, ne;

	memset(ctx->scnt, 0, sizeof(ctx->scnt));
	memset(ctx->ccnt, 0, sizeof(ctx->ccnt));

	while (done < want) {
		for (q = 0; q < cfg->num_qps; q++) {
			while (ctx->scnt[q] < cfg->iters &&
			       ctx->scnt[q] - ctx->ccnt[q] + cfg->post_list <= cfg->tx_depth) {
				struct ibv_send_wr *tail = &ctx->wr[q][cfg->post_list - 1];
				int last = ctx->scnt[q] + cfg->post_list >= cfg->iters;

				/* OK: rdma-unsignaled-send-starvation -- lists_since_sig advances on every list and is reset when the tail is signaled */
				if (++ctx->lists_since_sig[q] >= cfg->cq_mod || last) {
					tail->wr_id = WRID(q, ctx->lists_since_sig[q] * cfg->post_list);
					tail->send_flags |= IBV_SEND_SIGNALED;
					ctx->lists_since_sig[q] = 0;
				} else {
					tail->send_flags &= ~IBV_SEND_SIGNALED;
				}
				if (ibv_post_send(ctx->qp[q], &ctx->wr[q][0], &bad)) {
					fprintf(stderr, "post_send qp %d failed after %lu\n",
						q, (unsigned long)ctx->scnt[q]);
					return -1;
				}
				ctx->scnt[q] += cfg->post_list;
			}
		}

		ne = ibv_poll_cq(ctx->send_cq, WC_BATCH, wc);
		if (ne < 0)
			return -1;
		for (i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "wc status %s\n", ibv_wc_status_str(wc[i].status));
				return -1;
			}
			ctx->ccnt[WRID_QP(wc[i].wr_id)] += WRID_CNT(wc[i].wr_id);
			done += WRID_CNT(wc[i].wr_id);
		}
	}
	return 0;
}

static void prepare_wrs(struct bench_ctx *ctx, const struct bench_cfg *cfg)
{
	int q, i, s;
	size_t chunk = cfg->size / cfg->num_sge;

	for (q = 0; q < cfg->num_qps; q++) {
		char *base = (char *)ctx->buf + q * cfg->size;

		for (i = 0; i < (int)cfg->post_list; i++) {
			struct ibv_send_wr *wr = &ctx->wr[q][i];

			memset(wr, 0, sizeof(*wr));
			wr->wr_id = WRID(q, 0);
			wr->next = i + 1 < (int)cfg->post_list ? &ctx->wr[q][i + 1] : NULL;
			wr->sg_list = ctx->sge[q][i];
			if (cfg->verb == VERB_ATOMIC) {
				ctx->sge[q][i][0].addr = (uintptr_t)&ctx->res_buf[q];
				ctx->sge[q][i][0].length = sizeof(uint64_t);
				ctx->sge[q][i][0].lkey = ctx->res_mr->lkey;
				wr->num_sge = 1;
				wr->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
				wr->wr.atomic.remote_addr = ctx->rem.vaddr + q * cfg->size;
				wr->wr.atomic.compare_add = 1;
				wr->wr.atomic.rkey = ctx->rem.rkey;
				continue;
			}
			for (s = 0; s < (int)cfg->num_sge; s++) {
				ctx->sge[q][i][s].addr = (uintptr_t)(base + s * chunk);
				ctx->sge[q][i][s].length = chunk;
				ctx->sge[q][i][s].lkey = ctx->mr->lkey;
			}
			wr->num_sge = cfg->num_sge;
			wr->opcode = IBV_WR_RDMA_WRITE;
			if (cfg->size <= cfg->inline_size)
				wr->send_flags = IBV_SEND_INLINE;
			wr->wr.rdma.remote_addr = ctx->rem.vaddr + q * cfg->size;
			wr->wr.rdma.rkey = ctx->rem.rkey;
		}
	}
}

/* TCP exchange and QP state transitions live in the shared perftest glue */
int bench_exch_dest(const struct bench_cfg *cfg, const struct bench_dest *local,
		    struct bench_dest *rem);

int bench_qp_to_rts(struct ibv_qp *qp, int ib_port, uint32_t rem_qpn,
		    uint32_t psn, uint16_t dlid);

static int bench_connect_qps(struct bench_ctx *ctx, const struct bench_cfg *cfg)
{
	int i;

	for (i = 0; i < cfg->num_qps; i++)
		if (bench_qp_to_rts(ctx->qp[i], cfg->ib_port, ctx->rem.qpn[i],
				    ctx->rem.psn, ctx->rem.lid))
			return -1;
	return bench_qp_to_rts(ctx->sync_qp, cfg->ib_port, ctx->rem.sync_qpn,
			       ctx->rem.psn, ctx->rem.lid);
}

static int parse_args(int argc, char **argv, struct bench_cfg *cfg)
{
	int c;

	*cfg = (struct bench_cfg){ .port = "18515", .ib_port = 1, .num_qps = 1,
		.tx_depth = DEF_TX_DEPTH, .post_list = 1, .cq_mod = DEF_CQ_MOD,
		.num_sge = 1, .inline_size = 0, .size = 65536, .iters = 5000,
		.rounds = 1 };
	while ((c = getopt(argc, argv, "d:p:i:q:t:l:Q:S:I:s:n:r:AoO")) != -1) {
		switch (c) {
		case 'd': cfg->ib_devname = optarg; break;
		case 'p': cfg->port = optarg; break;
		case 'i': cfg->ib_port = atoi(optarg); break;
		case 'q': cfg->num_qps = atoi(optarg); break;
		case 't': cfg->tx_depth = strtoul(optarg, NULL, 0); break;
		case 'l': cfg->post_list = strtoul(optarg, NULL, 0); break;
		case 'Q': cfg->cq_mod = strtoul(optarg, NULL, 0); break;
		case 'S': cfg->num_sge = strtoul(optarg, NULL, 0); break;
		case 'I': cfg->inline_size = strtoul(optarg, NULL, 0); break;
		case 's': cfg->size = strtoull(optarg, NULL, 0); break;
		case 'n': cfg->iters = strtoull(optarg, NULL, 0); break;
		case 'r': cfg->rounds = atoi(optarg); break;
		case 'A': cfg->verb = VERB_ATOMIC; cfg->size = 8; break;
		case 'o': cfg->odp = 1; break;
		case 'O': cfg->odp = cfg->odp_implicit = 1; break;
		default: return -1;
		}
	}
	if (optind < argc)
		cfg->servername = argv[optind];
	if (cfg->num_qps < 1 || cfg->num_qps > MAX_QPS)
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct bench_cfg cfg;
	struct bench_ctx *ctx;
	struct bench_dest local = { 0 };
	struct ibv_device **list;
	int i, r, ret = 1;

	if (parse_args(argc, argv, &cfg))
		return 1;
	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		return 1;
	for (i = 0; cfg.ib_devname && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), cfg.ib_devname))
			break;
	if (!list[i])
		return 1;

	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return 1;
	ctx->context = ibv_open_device(list[i]);
	if (!ctx->context || ibv_query_device(ctx->context, &ctx->dev_attr))
		return 1;
	check_limits(ctx, &cfg);

	ctx->pd = ibv_alloc_pd(ctx->context);
	ctx->send_cq = ibv_create_cq(ctx->context, cfg.tx_depth * cfg.num_qps, NULL, NULL, 0);
	ctx->sync_cq = ibv_create_cq(ctx->context, 2 * SYNC_DEPTH, NULL, NULL, 0);
	if (!ctx->pd || !ctx->send_cq || !ctx->sync_cq)
		return 1;
	if (alloc_buffers(ctx, &cfg) || create_data_qps(ctx, &cfg) || create_sync_qp(ctx))
		return 1;

	for (i = 0; i < cfg.num_qps; i++)
		local.qpn[i] = ctx->qp[i]->qp_num;
	local.sync_qpn = ctx->sync_qp->qp_num;
	local.rkey = ctx->mr->rkey;
	local.vaddr = (uintptr_t)ctx->buf;
	local.psn = lrand48() & 0xffffff;
	if (bench_exch_dest(&cfg, &local, &ctx->rem) || bench_connect_qps(ctx, &cfg))
		return 1;
	if (sync_init(ctx))
		return 1;

	for (r = 0; r < cfg.rounds; r++) {
		if (cfg.servername) {
			prepare_wrs(ctx, &cfg);
			if (run_iter_bw(ctx, &cfg))
				goto out;
		}
		if (sync_send(ctx, "ROUND %d DONE", r) || sync_wait(ctx))
			goto out;
	}
	ret = 0;
out:
	for (i = 0; i < cfg.num_qps; i++)
		ibv_destroy_qp(ctx->qp[i]);
	ibv_destroy_qp(ctx->sync_qp);
	ibv_dereg_mr(ctx->sync_mr);
	if (ctx->res_mr)
		ibv_dereg_mr(ctx->res_mr);
	ibv_dereg_mr(ctx->mr);
	ibv_destroy_cq(ctx->send_cq);
	ibv_destroy_cq(ctx->sync_cq);
	ibv_dealloc_pd(ctx->pd);
	ibv_close_device(ctx->context);
	ibv_free_device_list(list);
	return ret;
}
