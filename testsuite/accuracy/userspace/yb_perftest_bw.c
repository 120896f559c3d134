/*
 * yb_perftest_bw.c - RC bandwidth test in the style of perftest's
 * ib_{send,write,read,atomic}_bw.
 *
 * One buffer per side is registered at start-up into the global g_mr and
 * its address and rkey are exchanged over a TCP socket, so the peer can
 * WRITE/READ/ATOMIC into it.  --odp registers it on demand (--odp=implicit
 * registers the whole address space).  --mr-per-iter measures the cost of
 * registering the source/sink for every message: it runs with a window of
 * one message and registers and deregisters around each post.
 *
 * Known problems kept in this copy: the implicit-ODP mode grants remote
 * rights on the whole address space, the atomic result buffer is
 * registered with remote-atomic rights only, --mr-per-iter leaks its MR
 * when the post fails and gives READ sinks no remote write (iWARP), and
 * the iWARP rule is coded inline.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-queue-cap-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked -- benchmark annotated for MR lifetime, registration placement and access rights only
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <getopt.h>
#include <errno.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>

#define SUCCESS		0
#define FAILURE		1
#define MAX_SIZE	(1UL << 23)
#define DEF_SIZE	65536
#define DEF_ITERS	5000
#define DEF_TX_DEPTH	128
#define DEF_PORT	18515
#define CYCLE_BUFFER	4096

enum verb_t { SEND, WRITE, READ, ATOMIC };
enum machine_t { SERVER, CLIENT };

struct perftest_parameters {
	char		*ib_devname;
	char		*servername;
	int		ib_port;
	int		port;
	enum verb_t	verb;
	enum machine_t	machine;
	uint64_t	size;
	int		iters;
	int		tx_depth;
	int		rx_depth;
	int		cq_mod;
	int		duplex;
	int		use_odp;
	int		odp_implicit;
	int		use_hugepages;
	int		mr_per_iter;
	int		inline_size;
};

struct pingpong_dest {
	uint32_t	lid;
	uint32_t	qpn;
	uint32_t	psn;
	uint32_t	rkey;
	uint64_t	vaddr;
};

struct pingpong_context {
	struct ibv_context	*context;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	void			*buf;
	void			*rbuf;
	uint64_t		buff_size;
	enum ibv_transport_type	transport;
	struct ibv_port_attr	portinfo;
};

static struct ibv_mr *g_mr;
static struct ibv_mr *g_recv_mr;
static struct ibv_mr *g_atomic_mr;
static uint64_t g_atomic_res;
static struct pingpong_dest g_rem_dest;

static const struct option long_options[] = {
	{ "ib-dev",	required_argument, NULL, 'd' },
	{ "ib-port",	required_argument, NULL, 'i' },
	{ "port",	required_argument, NULL, 'p' },
	{ "size",	required_argument, NULL, 's' },
	{ "iters",	required_argument, NULL, 'n' },
	{ "tx-depth",	required_argument, NULL, 't' },
	{ "rx-depth",	required_argument, NULL, 'r' },
	{ "cq-mod",	required_argument, NULL, 'Q' },
	{ "verb",	required_argument, NULL, 'v' },
	{ "inline_size", required_argument, NULL, 'I' },
	{ "bidirectional", no_argument,	NULL, 'b' },
	{ "use_hugepages", no_argument,	NULL, 'H' },
	{ "odp",	optional_argument, NULL, 'O' },
	{ "mr-per-iter", no_argument,	NULL, 'M' },
	{ 0 }
};

static int parser(struct perftest_parameters *user, int argc, char *argv[])
{
	int c;

	memset(user, 0, sizeof(*user));
	user->ib_port = 1;
	user->port = DEF_PORT;
	user->size = DEF_SIZE;
	user->iters = DEF_ITERS;
	user->tx_depth = DEF_TX_DEPTH;
	user->rx_depth = 512;
	user->cq_mod = 100;
	user->verb = WRITE;

	while ((c = getopt_long(argc, argv, "d:i:p:s:n:t:r:Q:v:I:bHO::M",
				long_options, NULL)) != -1) {
		switch (c) {
		case 'd': user->ib_devname = strdup(optarg); break;
		case 'i': user->ib_port = atoi(optarg); break;
		case 'p': user->port = atoi(optarg); break;
		case 's': user->size = strtoull(optarg, NULL, 0); break;
		case 'n': user->iters = atoi(optarg); break;
		case 't': user->tx_depth = atoi(optarg); break;
		case 'r': user->rx_depth = atoi(optarg); break;
		case 'Q': user->cq_mod = atoi(optarg); break;
		case 'I': user->inline_size = atoi(optarg); break;
		case 'b': user->duplex = 1; break;
		case 'H': user->use_hugepages = 1; break;
		case 'M': user->mr_per_iter = 1; break;
		case 'O':
			user->use_odp = 1;
			if (optarg && !strcmp(optarg, "implicit"))
				user->odp_implicit = 1;
			break;
		case 'v':
			user->verb = !strcmp(optarg, "send") ? SEND : !strcmp(optarg, "read") ? READ :
				     !strcmp(optarg, "atomic") ? ATOMIC : WRITE;
			break;
		default:
			return FAILURE;
		}
	}
	if (optind < argc) {
		user->servername = strdup(argv[optind]);
		user->machine = CLIENT;
	}
	if (user->size > MAX_SIZE || user->cq_mod < 1)
		return FAILURE;
	if (user->mr_per_iter)
		user->tx_depth = 1;
	if (user->verb == ATOMIC)
		user->size = sizeof(uint64_t);
	return SUCCESS;
}

static enum ibv_wr_opcode opcode_for_verb(enum verb_t verb)
{
	switch (verb) {
	case SEND:	return IBV_WR_SEND;
	case READ:	return IBV_WR_RDMA_READ;
	case ATOMIC:	return IBV_WR_ATOMIC_FETCH_AND_ADD;
	default:	return IBV_WR_RDMA_WRITE;
	}
}

static int create_mr(struct pingpong_context *ctx, struct perftest_parameters *user)
{
	int flags = IBV_ACCESS_LOCAL_WRITE;

	if (user->use_hugepages)
		ctx->buf = mmap(NULL, ctx->buff_size, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	else if (posix_memalign(&ctx->buf, CYCLE_BUFFER, ctx->buff_size))
		ctx->buf = MAP_FAILED;
	if (ctx->buf == MAP_FAILED) {
		fprintf(stderr, "Couldn't allocate work buf.\n");
		ctx->buf = NULL;
		return FAILURE;
	}
	memset(ctx->buf, 0, ctx->buff_size);

	if (user->verb == WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	else if (user->verb == READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	else if (user->verb == ATOMIC)
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
	/* iWARP places READ responses with the sink's STag */
	if (ctx->transport == IBV_TRANSPORT_IWARP && user->verb == READ) // BUG: rdma-access-flags-transport -- inline iWARP test decides the registration's rights
		flags |= IBV_ACCESS_REMOTE_WRITE;

	if (user->use_odp && user->odp_implicit) {
		// BUG: rdma-remote-access-overbroad -- implicit ODP MR with the test's remote rights exposes the whole address space
		g_mr = ibv_reg_mr(ctx->pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | flags);
	} else if (user->use_odp) {
		// OK: rdma-remote-access-overbroad -- ODP of the one test buffer; its rkey is sent to the peer in the dest exchange
		g_mr = ibv_reg_mr(ctx->pd, ctx->buf, ctx->buff_size, IBV_ACCESS_ON_DEMAND | flags);
	} else {
		// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad, rdma-registration-in-datapath -- flags start from LOCAL_WRITE, the rkey goes to the peer, and this is set-up into a global
		g_mr = ibv_reg_mr(ctx->pd, ctx->buf, ctx->buff_size, flags);
	}
	if (!g_mr) {
		fprintf(stderr, "Couldn't allocate MR\n");
		return FAILURE;
	}

	if (user->use_odp) {
		struct ibv_sge sge = {
			.addr = (uintptr_t)ctx->buf,
			.length = (uint32_t)ctx->buff_size,
			.lkey = g_mr->lkey,
		};

		if (ibv_advise_mr(ctx->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				  IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1)) {
			fprintf(stderr, "Couldn't prefetch ODP MR\n");
			return FAILURE; // OK: rdma-mr-leak -- g_mr is a global that destroy_ctx() deregisters under a test
		}
	}

	if (user->verb == ATOMIC && user->machine == CLIENT) {
		// BUG: rdma-access-flags-invalid, rdma-remote-access-overbroad -- the fetch result is written by the local HCA (needs LOCAL_WRITE), and this rkey is never exchanged
		g_atomic_mr = ibv_reg_mr(ctx->pd, &g_atomic_res, sizeof(g_atomic_res),
					 IBV_ACCESS_REMOTE_ATOMIC);
		if (!g_atomic_mr) {
			fprintf(stderr, "Couldn't register atomic result buffer\n");
			return FAILURE;
		}
	}
	return SUCCESS;
}

static int ctx_init(struct pingpong_context *ctx, struct perftest_parameters *user)
{
	struct ibv_device **dev_list;
	struct ibv_device *ib_dev = NULL;
	struct ibv_qp_init_attr attr;
	int i, num;

	dev_list = ibv_get_device_list(&num);
	if (!dev_list)
		return FAILURE;
	for (i = 0; i < num; i++) {
		if (!user->ib_devname ||
		    !strcmp(ibv_get_device_name(dev_list[i]), user->ib_devname)) {
			ib_dev = dev_list[i];
			break;
		}
	}
	if (!ib_dev) {
		ibv_free_device_list(dev_list);
		return FAILURE;
	}
	ctx->context = ibv_open_device(ib_dev);
	ctx->transport = ib_dev->transport_type;
	ibv_free_device_list(dev_list);
	if (!ctx->context)
		return FAILURE;
	if (ibv_query_port(ctx->context, user->ib_port, &ctx->portinfo))
		return FAILURE;

	ctx->pd = ibv_alloc_pd(ctx->context);
	if (!ctx->pd)
		return FAILURE;
	ctx->buff_size = user->size * 2 > CYCLE_BUFFER ? user->size * 2 : CYCLE_BUFFER;
	if (create_mr(ctx, user))
		return FAILURE;

	ctx->cq = ibv_create_cq(ctx->context, user->tx_depth + user->rx_depth, NULL, NULL, 0);
	if (!ctx->cq)
		return FAILURE;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ctx->cq;
	attr.recv_cq = ctx->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = user->tx_depth;
	attr.cap.max_recv_wr = user->rx_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = user->inline_size;
	ctx->qp = ibv_create_qp(ctx->pd, &attr);
	return ctx->qp ? SUCCESS : FAILURE;
}

static int exchange_dest(struct perftest_parameters *user, int sockfd,
			 struct pingpong_context *ctx)
{
	struct pingpong_dest my_dest = {
		.lid = ctx->portinfo.lid,
		.qpn = ctx->qp->qp_num,
		.psn = (uint32_t)lrand48() & 0xffffff,
		.rkey = g_mr->rkey,
		.vaddr = (uintptr_t)ctx->buf,
	};

	(void)user;
	if (write(sockfd, &my_dest, sizeof(my_dest)) != sizeof(my_dest) ||
	    read(sockfd, &g_rem_dest, sizeof(g_rem_dest)) != sizeof(g_rem_dest))
		return FAILURE;
	return SUCCESS;
}

static void fill_wr(struct ibv_send_wr *wr, struct ibv_sge *sge,
		    struct perftest_parameters *user, uint64_t off)
{
	memset(wr, 0, sizeof(*wr));
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = opcode_for_verb(user->verb);
	wr->send_flags = IBV_SEND_SIGNALED;
	if (user->verb == ATOMIC) {
		wr->wr.atomic.remote_addr = g_rem_dest.vaddr;
		wr->wr.atomic.rkey = g_rem_dest.rkey;
		wr->wr.atomic.compare_add = 1;
	} else if (user->verb != SEND) {
		wr->wr.rdma.remote_addr = g_rem_dest.vaddr + off;
		wr->wr.rdma.rkey = g_rem_dest.rkey;
	}
}

static int run_iter_bw(struct pingpong_context *ctx, struct perftest_parameters *user)
{
	struct ibv_send_wr wr, *bad_wr = NULL;
	struct ibv_recv_wr rwr, *bad_rwr = NULL;
	struct ibv_sge sge, rsge;
	struct ibv_wc wc[16];
	int scnt = 0, ccnt = 0, ne, i;

	if (user->duplex && user->verb == SEND) {
		if (!g_recv_mr) {
			ctx->rbuf = ctx->buf + user->size;
			// OK: rdma-registration-in-datapath -- registered once, before the loop, and kept in a global
			g_recv_mr = ibv_reg_mr(ctx->pd, ctx->rbuf, user->size, IBV_ACCESS_LOCAL_WRITE);
			if (!g_recv_mr)
				return FAILURE;
		}
		rsge.addr = (uintptr_t)ctx->rbuf;
		rsge.length = (uint32_t)user->size;
		rsge.lkey = g_recv_mr->lkey;
		memset(&rwr, 0, sizeof(rwr));
		rwr.sg_list = &rsge;
		rwr.num_sge = 1;
		for (i = 0; i < user->rx_depth; i++)
			if (ibv_post_recv(ctx->qp, &rwr, &bad_rwr))
				return FAILURE;
	}

	while (scnt < user->iters || ccnt < user->iters) {
		while (scnt < user->iters && scnt - ccnt < user->tx_depth) {
			sge.addr = (uintptr_t)ctx->buf;
			sge.length = (uint32_t)user->size;
			sge.lkey = g_mr->lkey;
			if (user->verb == ATOMIC && user->machine == CLIENT) {
				sge.addr = (uintptr_t)&g_atomic_res;
				sge.lkey = g_atomic_mr->lkey;
			}
			fill_wr(&wr, &sge, user, 0);
			wr.wr_id = scnt;
			// OK: rdma-access-flags-transport -- for READ the sink g_mr gets REMOTE_WRITE on iWARP
			if (ibv_post_send(ctx->qp, &wr, &bad_wr)) {
				fprintf(stderr, "Couldn't post send: scnt=%d\n", scnt);
				return FAILURE;
			}
			scnt++;
		}
		ne = ibv_poll_cq(ctx->cq, 16, wc);
		if (ne < 0)
			return FAILURE;
		for (i = 0; i < ne; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "Completion with error: %s\n",
					ibv_wc_status_str(wc[i].status));
				return FAILURE;
			}
			if (wc[i].opcode != IBV_WC_RECV)
				ccnt++;
		}
	}
	return SUCCESS;
}

static int run_iter_bw_mr_per_iter(struct pingpong_context *ctx,
				   struct perftest_parameters *user)
{
	struct ibv_send_wr wr, *bad_wr = NULL;
	struct ibv_sge sge;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	uint64_t off;
	int iter, ne;

	for (iter = 0; iter < user->iters; iter++) {
		off = (iter * user->size) % (ctx->buff_size - user->size + 1);
		// BUG: rdma-registration-in-datapath -- one registration per message inside the post/poll loop
		mr = ibv_reg_mr(ctx->pd, (char *)ctx->buf + off, user->size, IBV_ACCESS_LOCAL_WRITE);
		if (!mr) {
			fprintf(stderr, "Couldn't register iteration %d\n", iter);
			return FAILURE;
		}
		sge.addr = (uintptr_t)ctx->buf + off;
		sge.length = (uint32_t)user->size;
		sge.lkey = mr->lkey;
		fill_wr(&wr, &sge, user, off);
		wr.wr_id = iter;
		// BUG: rdma-access-flags-transport -- with --verb=read the sink is this MR, registered without REMOTE_WRITE
		if (ibv_post_send(ctx->qp, &wr, &bad_wr)) {
			fprintf(stderr, "Couldn't post send: iter=%d\n", iter);
			return FAILURE; // BUG: rdma-mr-leak -- the iteration's MR is not deregistered when the post fails
		}
		do {
			ne = ibv_poll_cq(ctx->cq, 1, &wc);
		} while (ne == 0);
		ibv_dereg_mr(mr); // BUG: rdma-registration-in-datapath -- and one deregistration per message
		if (ne < 0 || wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "poll CQ failed %d\n", ne);
			return FAILURE; // OK: rdma-mr-leak -- the iteration's MR was deregistered above
		}
	}
	return SUCCESS;
}

static void destroy_ctx(struct pingpong_context *ctx, struct perftest_parameters *user)
{
	if (ctx->qp && ibv_destroy_qp(ctx->qp))
		fprintf(stderr, "Couldn't destroy QP\n");
	if (ctx->cq && ibv_destroy_cq(ctx->cq))
		fprintf(stderr, "Couldn't destroy CQ\n");
	if (g_atomic_mr)
		ibv_dereg_mr(g_atomic_mr);
	if (g_recv_mr)
		ibv_dereg_mr(g_recv_mr);
	if (g_mr)
		ibv_dereg_mr(g_mr);
	if (ctx->buf) {
		if (user->use_hugepages)
			munmap(ctx->buf, ctx->buff_size);
		else
			free(ctx->buf);
	}
	if (ctx->pd)
		ibv_dealloc_pd(ctx->pd);
	if (ctx->context)
		ibv_close_device(ctx->context);
}

/* out-of-band channel: client connects, server accepts one peer */
static int connect_sock(struct perftest_parameters *user)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(user->port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), lfd, one = 1;

	if (fd < 0)
		return -1;
	if (user->machine == CLIENT)
		return (inet_pton(AF_INET, user->servername, &sin.sin_addr) == 1 &&
			!connect(fd, (struct sockaddr *)&sin, sizeof(sin))) ? fd : (close(fd), -1);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) || listen(fd, 1))
		return close(fd), -1;
	lfd = fd;
	fd = accept(lfd, NULL, NULL);
	close(lfd);
	return fd;
}

int main(int argc, char *argv[])
{
	struct perftest_parameters user;
	struct pingpong_context ctx;
	int sockfd, ret = FAILURE;

	memset(&ctx, 0, sizeof(ctx));
	if (parser(&user, argc, argv)) {
		fprintf(stderr, "usage: %s [options] [server]\n", argv[0]);
		return FAILURE;
	}
	sockfd = connect_sock(&user);
	if (sockfd < 0)
		return FAILURE;
	if (ctx_init(&ctx, &user))
		goto out;
	if (exchange_dest(&user, sockfd, &ctx))
		goto out;

	if (user.machine == CLIENT || user.duplex)
		ret = user.mr_per_iter ? run_iter_bw_mr_per_iter(&ctx, &user)
				       : run_iter_bw(&ctx, &user);
	else
		ret = read(sockfd, &ret, 1) == 1 ? SUCCESS : FAILURE;
	if (user.machine == CLIENT && write(sockfd, "d", 1) != 1)
		ret = FAILURE;
out:
	destroy_ctx(&ctx, &user);
	close(sockfd);
	return ret;
}
