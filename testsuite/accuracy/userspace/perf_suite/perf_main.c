/*
 * perf_main.c: option parsing for the latency benchmark.
 *
 * The defaults are the problem: a 512-byte inline size (fits the
 * developer's adapter; many providers allow much less) and send flags of
 * IBV_SEND_INLINE alone, which perf_lat.c uses for every SEND on a QP
 * that only signals requested work requests.  See perf_lat.c.
 */
#include "perf.h"

#include <stdlib.h>
#include <string.h>
#include <getopt.h>

#define PERF_DEF_INLINE	512

int main(int argc, char **argv)
{
	struct perf_user user = {
		.size = 64,
		.iters = 1000,
		.tx_depth = 128,
		.inline_size = PERF_DEF_INLINE,
		.send_flags = IBV_SEND_INLINE,
		.ib_port = 1,
	};
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct perf_peer me, peer;
	int c, ret;

	while ((c = getopt(argc, argv, "s:n:t:I:")) != -1) {
		switch (c) {
		case 's': user.size = strtoul(optarg, NULL, 0); break;
		case 'n': user.iters = strtoul(optarg, NULL, 0); break;
		case 't': user.tx_depth = strtoul(optarg, NULL, 0); break;
		case 'I': user.inline_size = strtoul(optarg, NULL, 0); break;
		default: return 1;
		}
	}
	if (user.size > user.inline_size)
		user.send_flags = 0;

	devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0])
		return 1;
	ctx = ibv_open_device(devs[0]);
	ibv_free_device_list(devs);
	if (!ctx)
		return 1;
	memset(&peer, 0, sizeof(peer));
	ret = perf_lat_run(ctx, &user, &me, &peer);
	ibv_close_device(ctx);
	return ret ? 1 : 0;
}
