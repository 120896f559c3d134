/*
 * xfer: a generic one-sided transfer engine ("put" and "get" between a
 * local cache and remote memory).  Both directions share one work-request
 * builder whose opcode is chosen by the direction; the local side is
 * always the cache, registered once with LOCAL_WRITE.
 *
 * Not correct: for a get the cache is the sink of an RDMA READ and has no
 * REMOTE_WRITE, which iWARP requires; the engine is used on iWARP
 * clusters.  (A put is fine: a WRITE source needs no rights.)
 * Correct: every transfer is signaled; the send queue holds one WR per
 * outstanding transfer and the engine never has more than depth of them.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum xfer_dir { XFER_PUT, XFER_GET };

struct xfer_engine {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char          *cache;
	size_t         cache_len;
	struct ibv_mr *cache_mr;
	unsigned int   depth, inflight;
};

int xfer_engine_init(struct xfer_engine *e)
{
	struct ibv_qp_init_attr attr;

	e->cache = aligned_alloc(4096, e->cache_len);
	if (!e->cache)
		return -ENOMEM;
	e->cache_mr = ibv_reg_mr(e->pd, e->cache, e->cache_len, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- the cache is the local side of the engine's own READ/WRITE
	if (!e->cache_mr) {
		free(e->cache);
		return -errno;
	}
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = e->cq;
	attr.recv_cq = e->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- one WR per transfer, at most depth in flight */
	attr.cap.max_send_wr = e->depth;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	e->qp = ibv_create_qp(e->pd, &attr);
	if (!e->qp) {
		ibv_dereg_mr(e->cache_mr);
		free(e->cache);
		return -errno;
	}
	return 0;
}

int xfer_post(struct xfer_engine *e, enum xfer_dir dir, size_t cache_off,
	      uint64_t raddr, uint32_t rkey, uint32_t len, uint64_t cookie)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (e->inflight == e->depth)
		return -EAGAIN;
	if (cache_off + len > e->cache_len)
		return -EINVAL;
	sge.addr = (uintptr_t)(e->cache + cache_off);
	sge.length = len;
	sge.lkey = e->cache_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = cookie;
	wr.opcode = dir == XFER_GET ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	e->inflight++;
	// BUG: rdma-access-flags-transport -- on a get the cache (LOCAL_WRITE only) is the READ sink; fails on iWARP
	return ibv_post_send(e->qp, &wr, &bad);
}

int xfer_reap(struct xfer_engine *e, uint64_t *cookies, int max)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(e->cq, max < 16 ? max : 16, wc);
	for (i = 0; i < n; i++) {
		cookies[i] = wc[i].wr_id;
		e->inflight--;
	}
	return n;
}
