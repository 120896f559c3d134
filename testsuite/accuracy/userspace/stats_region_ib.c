/*
 * ibstat: a fabric-statistics agent for InfiniBand clusters (it refuses
 * to start on iWARP adapters: it needs IB port counters).  It pulls
 * counter pages from peers with RDMA READ into a sample buffer, and keeps
 * its own counters in a local stats region.
 *
 * Correct: the sample buffer is a READ sink without REMOTE_WRITE, which
 * only iWARP would need, and iWARP devices are refused at open.
 * Not correct: the agent's own stats region was registered with
 * REMOTE_READ for a "pull mode" that was never implemented; its key is
 * never sent anywhere.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define IBSTAT_PAGE	4096

struct ibstat {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	char               *sample;
	struct ibv_mr      *sample_mr;
	uint64_t           *stats;
	struct ibv_mr      *stats_mr;
};

int ibstat_open(struct ibstat *s, struct ibv_device *dev)
{
	if (dev->transport_type != IBV_TRANSPORT_IB)
		return -EOPNOTSUPP;	/* IB port counters only */
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		return -errno;
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		return -errno;
	s->sample = aligned_alloc(4096, IBSTAT_PAGE);
	s->stats = aligned_alloc(4096, IBSTAT_PAGE);
	if (!s->sample || !s->stats)
		return -ENOMEM;
	s->sample_mr = ibv_reg_mr(s->pd, s->sample, IBSTAT_PAGE, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- the sample buffer is the sink of the agent's own READs
	if (!s->sample_mr)
		return -errno;
	// BUG: rdma-remote-access-overbroad -- REMOTE_READ on the stats region; its key is never sent
	s->stats_mr = ibv_reg_mr(s->pd, s->stats, IBSTAT_PAGE,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!s->stats_mr) {
		ibv_dereg_mr(s->sample_mr);
		return -errno;
	}
	return 0;
}

int ibstat_pull(struct ibstat *s, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)s->sample, IBSTAT_PAGE, s->sample_mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;
	struct ibv_wc wc;
	int n;

	/* OK: rdma-access-flags-transport -- no REMOTE_WRITE on the sink, but iWARP devices are refused in ibstat_open() */
	if (ibv_post_send(s->qp, &wr, &bad))
		return -EIO;
	do
		n = ibv_poll_cq(s->cq, 1, &wc);
	while (n == 0);
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	s->stats[0]++;
	return 0;
}
