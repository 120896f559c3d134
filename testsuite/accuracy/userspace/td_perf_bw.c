/*
 * td_perf_bw.c - perftest-style bandwidth/latency tool: one RC QP, one
 * buffer, SEND / RDMA WRITE / RDMA READ / ATOMIC over a post list.
 *
 * Send queue: the bandwidth loop keeps at most tx_depth WRs outstanding
 * (scnt - ccnt + post_list <= tx_depth) and signals every cq_mod-th post or
 * the last WR of a post list.  The write-latency loop keeps its own
 * unsignaled counter, which is never incremented: it never signals.
 *
 * Memory: the buffer's rights come from the verb under test; the iWARP
 * READ sink gets REMOTE_WRITE from a transport test next to the
 * registration, and the ATOMIC rights lack LOCAL_WRITE.  The SGE count for
 * the scatter-list test is never compared with the device.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define SUCCESS		0
#define FAILURE		1
#define MAX_SEND_SGE	16	/* -S: scatter the message over up to 16 SGEs */
#define MAX_RECV_SGE	1
#define RX_RING_SIZE	4096
#define CTX_POLL_BATCH	16
#define DEF_TX_DEPTH	128
#define DEF_CQ_MOD	100

enum verb { SEND, WRITE, READ, ATOMIC };
enum machine { CLIENT, SERVER };

struct perftest_parameters {
	enum verb	verb;
	enum machine	machine;
	const char	*ib_devname;
	uint8_t		ib_port;
	uint32_t	tx_depth;
	uint32_t	rx_depth;
	uint32_t	post_list;
	uint32_t	cq_mod;
	uint32_t	num_sge;
	uint32_t	inline_size;
	uint64_t	iters;
	uint64_t	size;
	int		test_lat;
};

struct pingpong_dest {
	uint32_t	qpn;
	uint32_t	psn;
	uint16_t	lid;
	uint64_t	vaddr;
	uint32_t	rkey;
};

struct pingpong_context {
	struct ibv_context	*context;
	struct ibv_device_attr	dev_attr;
	struct ibv_port_attr	port_attr;
	struct ibv_pd		*pd;
	struct ibv_mr		*mr;
	struct ibv_cq		*send_cq;
	struct ibv_cq		*recv_cq;
	struct ibv_qp		*qp;
	void			*buf;
	uint64_t		buff_size;
	struct ibv_sge		*sge_list;
	struct ibv_send_wr	*wr;
	uint64_t		lat_unsignaled;
};

static int access_for_verb(enum verb verb)
{
	switch (verb) {
	case WRITE:
		return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	case READ:
		return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	case ATOMIC:
		/* the peer only needs to hit the target word */
		return IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ;
	case SEND:
	default:
		return IBV_ACCESS_LOCAL_WRITE;
	}
}

static enum ibv_wr_opcode opcode_verbs(enum verb verb)
{
	switch (verb) {
	case WRITE:	return IBV_WR_RDMA_WRITE;
	case READ:	return IBV_WR_RDMA_READ;
	case ATOMIC:	return IBV_WR_ATOMIC_FETCH_AND_ADD;
	default:	return IBV_WR_SEND;
	}
}

static int check_device_caps(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	if (ibv_query_device(ctx->context, &ctx->dev_attr) ||
	    ibv_query_port(ctx->context, user_param->ib_port, &ctx->port_attr)) {
		fprintf(stderr, " Unable to query device/port\n");
		return FAILURE;
	}
	/* OK: rdma-access-flags-transport -- refuses a test mode on iWARP, does not choose access flags */
	if (user_param->verb == ATOMIC &&
	    ctx->context->device->transport_type == IBV_TRANSPORT_IWARP) {
		fprintf(stderr, " Atomics are not supported on iWARP devices\n");
		return FAILURE;
	}
	if (ctx->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET && user_param->test_lat)
		fprintf(stderr, " RoCE: latency includes the Ethernet switch hop\n");
	if (user_param->tx_depth > (uint32_t)ctx->dev_attr.max_qp_wr)
		user_param->tx_depth = ctx->dev_attr.max_qp_wr;
	return SUCCESS;
}

static int create_mr(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	int flags = access_for_verb(user_param->verb);

	/* iWARP places READ responses with the sink's STag */
	if (user_param->verb == READ &&
	    ctx->context->device->transport_type == IBV_TRANSPORT_IWARP) // BUG: rdma-access-flags-transport -- access flags chosen by an inline transport test
		flags |= IBV_ACCESS_REMOTE_WRITE;

	ctx->buff_size = user_param->size * 2;
	ctx->buf = aligned_alloc(4096, (ctx->buff_size + 4095) & ~4095ULL);
	if (!ctx->buf)
		return FAILURE;
	memset(ctx->buf, 0, ctx->buff_size);
	ctx->mr = ibv_reg_mr(ctx->pd, ctx->buf, ctx->buff_size, flags); // BUG: rdma-access-flags-invalid -- on the ATOMIC path access_for_verb() gives REMOTE_ATOMIC without LOCAL_WRITE
	if (!ctx->mr) {
		fprintf(stderr, " Couldn't allocate MR: %s\n", strerror(errno));
		return FAILURE;
	}
	return SUCCESS;
}

static int ctx_qp_create(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ctx->send_cq;
	attr.recv_cq = ctx->recv_cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = user_param->tx_depth; // OK: rdma-send-queue-undersized -- every post is gated by scnt - ccnt + post_list <= tx_depth
	attr.cap.max_recv_wr = RX_RING_SIZE; // OK: rdma-queue-cap-unchecked -- clamped to dev_attr.max_qp_wr just below
	if (attr.cap.max_recv_wr > (uint32_t)ctx->dev_attr.max_qp_wr)
		attr.cap.max_recv_wr = ctx->dev_attr.max_qp_wr;
	attr.cap.max_send_sge = MAX_SEND_SGE; // BUG: rdma-queue-cap-unchecked -- 16 SGEs, dev_attr.max_sge is never read
	attr.cap.max_recv_sge = MAX_RECV_SGE;
	attr.cap.max_inline_data = user_param->inline_size;

	ctx->qp = ibv_create_qp(ctx->pd, &attr);
	if (!ctx->qp) {
		fprintf(stderr, " Couldn't create QP: %s\n", strerror(errno));
		return FAILURE;
	}
	if (attr.cap.max_inline_data < user_param->inline_size)
		user_param->inline_size = attr.cap.max_inline_data;
	return SUCCESS;
}

static void ctx_set_send_wqes(struct pingpong_context *ctx, struct perftest_parameters *user_param,
			      struct pingpong_dest *rem_dest)
{
	uint32_t i, j;
	uint32_t sge_len = user_param->size / user_param->num_sge;

	for (i = 0; i < user_param->post_list; i++) {
		struct ibv_sge *sg = &ctx->sge_list[i * user_param->num_sge];

		for (j = 0; j < user_param->num_sge; j++) {
			sg[j].addr = (uintptr_t)ctx->buf + j * sge_len;
			sg[j].length = sge_len;
			sg[j].lkey = ctx->mr->lkey;
		}
		memset(&ctx->wr[i], 0, sizeof(ctx->wr[i]));
		ctx->wr[i].wr_id = i;
		ctx->wr[i].sg_list = sg;
		ctx->wr[i].num_sge = user_param->num_sge;
		/* OK: rdma-access-flags-transport -- the READ sink is ctx->mr, which gets REMOTE_WRITE on iWARP */
		ctx->wr[i].opcode = opcode_verbs(user_param->verb);
		if (user_param->verb == ATOMIC) {
			ctx->wr[i].wr.atomic.remote_addr = rem_dest->vaddr;
			ctx->wr[i].wr.atomic.rkey = rem_dest->rkey;
			ctx->wr[i].wr.atomic.compare_add = 1;
		} else if (user_param->verb != SEND) {
			ctx->wr[i].wr.rdma.remote_addr = rem_dest->vaddr;
			ctx->wr[i].wr.rdma.rkey = rem_dest->rkey;
		}
		if (user_param->size <= user_param->inline_size && user_param->verb != READ)
			ctx->wr[i].send_flags |= IBV_SEND_INLINE;
		if (i + 1 < user_param->post_list)
			ctx->wr[i].next = &ctx->wr[i + 1];
		/* OK: rdma-unsignaled-send-starvation -- the last WR of each post list asks for a completion */
		if (i == user_param->post_list - 1)
			ctx->wr[i].send_flags |= IBV_SEND_SIGNALED;
	}
}

static int run_iter_bw(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	uint64_t scnt = 0, ccnt = 0;
	struct ibv_send_wr *bad_wr = NULL;
	struct ibv_wc wc[CTX_POLL_BATCH];
	int ne, i;

	while (scnt < user_param->iters || ccnt < user_param->iters) {
		while (scnt < user_param->iters &&
		       (scnt - ccnt + user_param->post_list) <= user_param->tx_depth) {
			/* OK: rdma-unsignaled-send-starvation -- scnt advances on every post */
			if (user_param->post_list == 1) {
				if (scnt % user_param->cq_mod == user_param->cq_mod - 1 ||
				    scnt == user_param->iters - 1)
					ctx->wr[0].send_flags |= IBV_SEND_SIGNALED;
				else
					ctx->wr[0].send_flags &= ~IBV_SEND_SIGNALED;
			}
			if (ibv_post_send(ctx->qp, &ctx->wr[0], &bad_wr)) {
				fprintf(stderr, " Couldn't post send: scnt=%lu\n", (unsigned long)scnt);
				return FAILURE;
			}
			scnt += user_param->post_list;
		}
		ne = ibv_poll_cq(ctx->send_cq, CTX_POLL_BATCH, wc);
		if (ne < 0)
			return FAILURE;
		for (i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, " Completion with error: %s\n",
					ibv_wc_status_str(wc[i].status));
				return FAILURE;
			}
			ccnt += user_param->post_list == 1 ? user_param->cq_mod : user_param->post_list;
			if (ccnt > scnt)
				ccnt = scnt;
		}
	}
	return SUCCESS;
}

static int run_iter_lat_write(struct pingpong_context *ctx, struct perftest_parameters *user_param)
{
	uint64_t scnt = 0, rcnt = 0;
	volatile char *poll_buf = (char *)ctx->buf + user_param->size;
	char *post_buf = (char *)ctx->buf;
	struct ibv_send_wr *wr = &ctx->wr[0], *bad_wr = NULL;
	struct ibv_wc wc;
	int ne;

	while (scnt < user_param->iters || rcnt < user_param->iters) {
		if (rcnt < user_param->iters && !(scnt < 1 && user_param->machine == SERVER)) {
			rcnt++;
			while (*poll_buf != (char)rcnt)
				;
		}
		if (scnt >= user_param->iters)
			continue;
		if (ctx->lat_unsignaled >= user_param->cq_mod) { // BUG: rdma-unsignaled-send-starvation -- lat_unsignaled is reset but never incremented; no latency WRITE is ever signaled
			wr->send_flags |= IBV_SEND_SIGNALED;
			ctx->lat_unsignaled = 0;
		} else {
			wr->send_flags &= ~IBV_SEND_SIGNALED;
		}
		*post_buf = (char)++scnt;
		if (ibv_post_send(ctx->qp, wr, &bad_wr)) {
			fprintf(stderr, " Couldn't post send: scnt=%lu\n", (unsigned long)scnt);
			return FAILURE;
		}
		if (wr->send_flags & IBV_SEND_SIGNALED) {
			do {
				ne = ibv_poll_cq(ctx->send_cq, 1, &wc);
			} while (ne == 0);
			if (ne < 0 || wc.status != IBV_WC_SUCCESS)
				return FAILURE;
		}
	}
	return SUCCESS;
}

static void usage(const char *argv0)
{
	printf("Usage: %s [-d dev] [-i port] [-t tx_depth] [-l post_list] [-Q cq_mod]\n"
	       "          [-S num_sge] [-I inline] [-n iters] [-s size] [-v send|write|read|atomic] [-L]\n",
	       argv0);
}

int main(int argc, char **argv)
{
	struct perftest_parameters user_param = {
		.verb = WRITE, .ib_port = 1, .tx_depth = DEF_TX_DEPTH, .rx_depth = 512,
		.post_list = 1, .cq_mod = DEF_CQ_MOD, .num_sge = 1, .iters = 5000, .size = 65536,
	};
	struct pingpong_context ctx;
	struct pingpong_dest rem_dest;
	struct ibv_device **dev_list;
	int c;

	memset(&ctx, 0, sizeof(ctx));
	while ((c = getopt(argc, argv, "d:i:t:l:Q:S:I:n:s:v:L")) != -1) {
		switch (c) {
		case 'd': user_param.ib_devname = optarg; break;
		case 'i': user_param.ib_port = (uint8_t)atoi(optarg); break;
		case 't': user_param.tx_depth = atoi(optarg); break;
		case 'l': user_param.post_list = atoi(optarg); break;
		case 'Q': user_param.cq_mod = atoi(optarg); break;
		case 'S': user_param.num_sge = atoi(optarg); break;
		case 'I': user_param.inline_size = atoi(optarg); break;
		case 'n': user_param.iters = strtoull(optarg, NULL, 0); break;
		case 's': user_param.size = strtoull(optarg, NULL, 0); break;
		case 'L': user_param.test_lat = 1; break;
		case 'v':
			user_param.verb = !strcmp(optarg, "send") ? SEND :
					  !strcmp(optarg, "read") ? READ :
					  !strcmp(optarg, "atomic") ? ATOMIC : WRITE;
			break;
		default: usage(argv[0]); return FAILURE;
		}
	}
	if (!user_param.cq_mod || !user_param.post_list || !user_param.num_sge ||
	    user_param.num_sge > MAX_SEND_SGE) {
		usage(argv[0]);
		return FAILURE;
	}
	if (user_param.verb == ATOMIC)
		user_param.size = 8;

	dev_list = ibv_get_device_list(NULL);
	if (!dev_list || !dev_list[0])
		return FAILURE;
	ctx.context = ibv_open_device(dev_list[0]);
	if (!ctx.context || check_device_caps(&ctx, &user_param))
		return FAILURE;
	ctx.pd = ibv_alloc_pd(ctx.context);
	ctx.send_cq = ibv_create_cq(ctx.context, user_param.tx_depth, NULL, NULL, 0);
	ctx.recv_cq = ibv_create_cq(ctx.context, RX_RING_SIZE, NULL, NULL, 0);
	if (!ctx.pd || !ctx.send_cq || !ctx.recv_cq)
		return FAILURE;
	if (create_mr(&ctx, &user_param) || ctx_qp_create(&ctx, &user_param))
		return FAILURE;

	ctx.wr = calloc(user_param.post_list, sizeof(*ctx.wr));
	ctx.sge_list = calloc((size_t)user_param.post_list * user_param.num_sge, sizeof(*ctx.sge_list));
	if (!ctx.wr || !ctx.sge_list)
		return FAILURE;

	/* QP transitions and the destination exchange run over the TCP side channel */
	if (scanf("%x %x %hx %lx %x", &rem_dest.qpn, &rem_dest.psn, &rem_dest.lid,
		  (unsigned long *)&rem_dest.vaddr, &rem_dest.rkey) != 5)
		return FAILURE;
	ctx_set_send_wqes(&ctx, &user_param, &rem_dest);

	if (user_param.test_lat && user_param.verb == WRITE)
		return run_iter_lat_write(&ctx, &user_param);
	return run_iter_bw(&ctx, &user_param);
}
