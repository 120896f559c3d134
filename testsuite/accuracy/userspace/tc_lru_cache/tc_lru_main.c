/*
 * tc_lru_main.c - blkcache server setup, statistics page, main loop and
 * teardown.
 *
 * The statistics page is readable by monitoring clients with RDMA READ; its
 * key goes out in the hello message every client receives on connect.  The
 * server keeps its handles in globals, and teardown releases whatever setup
 * managed to create.
 */
#include <endian.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "tc_lru.h"

struct lru_stats {
	uint64_t	gets;
	uint64_t	hits;
	uint64_t	puts;
	uint64_t	segs;
	uint64_t	shrinks;
};

struct lru_hello {
	uint32_t	qpn;
	uint32_t	stats_rkey;
	uint64_t	stats_addr;
	uint32_t	block_size;
	uint32_t	pad;
};

static struct lru_srv g_srv;
static struct lru_stats *g_stats;
static struct ibv_mr *g_stats_mr;
static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_pressure;

static int srv_setup(struct ibv_context *verbs, unsigned int max_segs)
{
	struct ibv_qp_init_attr attr;
	unsigned int i;

	g_srv.verbs = verbs;
	g_srv.max_segs = max_segs;
	g_srv.pd = ibv_alloc_pd(verbs);
	if (!g_srv.pd)
		return -errno;

	g_stats = aligned_alloc(4096, 4096);
	if (!g_stats)
		return -ENOMEM;
	memset(g_stats, 0, 4096);
	/* BUG: rdma-local-mr-management -- the statistics page is exposed to monitoring clients with its rkey */
	g_stats_mr = ibv_reg_mr(g_srv.pd, g_stats, 4096, IBV_ACCESS_REMOTE_READ); // OK: rdma-remote-access-overbroad -- the key is published in the hello message
	if (!g_stats_mr)
		return -errno;

	g_srv.cq = ibv_create_cq(verbs, 1024, NULL, NULL, 0);
	if (!g_srv.cq)
		return -errno; // OK: rdma-mr-leak -- the stats MR is kept in a global that srv_teardown() releases

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = g_srv.cq;
	attr.recv_cq = g_srv.cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 512;
	attr.cap.max_recv_wr = 256;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	g_srv.qp = ibv_create_qp(g_srv.pd, &attr);
	if (!g_srv.qp)
		return -errno;

	for (i = 0; i < LRU_INITIAL_SEGS; i++) {
		if (!lru_seg_create(&g_srv))
			goto err_segs;
	}
	g_srv.io = lru_io_create(&g_srv);
	if (!g_srv.io)
		goto err_segs;
	return 0;

err_segs:
	while (g_srv.nsegs)
		lru_seg_destroy(&g_srv, g_srv.segs[g_srv.nsegs - 1]);
	return -ENOMEM;
}

static void srv_teardown(void)
{
	if (g_srv.io)
		lru_io_destroy(g_srv.io);
	while (g_srv.nsegs)
		lru_seg_destroy(&g_srv, g_srv.segs[g_srv.nsegs - 1]);
	if (g_srv.qp)
		ibv_destroy_qp(g_srv.qp);
	if (g_srv.cq)
		ibv_destroy_cq(g_srv.cq);
	if (g_stats_mr)
		ibv_dereg_mr(g_stats_mr);
	free(g_stats);
	if (g_srv.pd)
		ibv_dealloc_pd(g_srv.pd);
}

int srv_send_hello(int fd)
{
	struct lru_hello hello;

	memset(&hello, 0, sizeof(hello));
	hello.qpn = htobe32(g_srv.qp->qp_num);
	hello.stats_rkey = htobe32(g_stats_mr->rkey);
	hello.stats_addr = htobe64((uintptr_t)g_stats);
	hello.block_size = htobe32(LRU_BLOCK_SIZE);
	return send(fd, &hello, sizeof(hello), 0) == sizeof(hello) ? 0 : -errno;
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		g_pressure = 1;
	else
		g_stop = 1;
}

int main(int argc, char **argv)
{
	struct ibv_device **devs;
	struct ibv_context *verbs;
	unsigned int max_segs = argc > 1 ? (unsigned int)atoi(argv[1]) : 64;
	int ret;

	if (max_segs == 0 || max_segs > LRU_MAX_SEGS)
		max_segs = LRU_MAX_SEGS;
	devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0]) {
		fprintf(stderr, "no RDMA device\n");
		return 1;
	}
	verbs = ibv_open_device(devs[0]);
	ibv_free_device_list(devs);
	if (!verbs)
		return 1;

	ret = srv_setup(verbs, max_segs);
	if (ret) {
		fprintf(stderr, "setup failed: %s\n", strerror(-ret));
		srv_teardown();
		ibv_close_device(verbs);
		return 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGUSR1, on_signal);

	while (!g_stop) {
		lru_io_poll(g_srv.io);
		if (g_pressure) {
			g_stats->shrinks += lru_seg_shrink(&g_srv, g_srv.nsegs / 2);
			g_pressure = 0;
		}
		g_stats->segs = g_srv.nsegs;
	}

	srv_teardown();
	ibv_close_device(verbs);
	return 0;
}
