/*
 * perf_suite: a small latency benchmark.  perf_main.c parses options and
 * fills struct perf_user; perf_lat.c builds the context and runs the
 * SEND/RECV ping-pong.
 */
#ifndef PERF_SUITE_H
#define PERF_SUITE_H

#include <infiniband/verbs.h>
#include <stdint.h>

struct perf_user {
	uint32_t     size;
	uint32_t     iters;
	uint32_t     tx_depth;
	uint32_t     inline_size;
	unsigned int send_flags;
	int          ib_port;
};

struct perf_peer {
	uint64_t addr;
	uint32_t rkey;
	uint32_t qpn;
};

int perf_lat_run(struct ibv_context *ctx, const struct perf_user *user,
		 struct perf_peer *me, const struct perf_peer *peer);

#endif
