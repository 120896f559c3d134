/*
 * imgsrv: an image-distribution agent that pulls layers from peers with
 * RDMA READ.  Two kinds of sinks exist: the layer cache (large, shared)
 * and per-pull scratch buffers used to verify chunk digests.
 *
 * Not correct:
 *  - the cache's flags are picked with a ternary on the node type
 *    (IBV_NODE_RNIC means iWARP) -- an inline transport test deciding
 *    access flags;
 *  - the digest scratch buffer is the sink of an RDMA READ but is
 *    registered LOCAL_WRITE only; this agent runs on iWARP NICs too.
 * Correct: READs into the cache (whatever the ternary chose, it gave
 * iWARP its REMOTE_WRITE); the cache's key is never sent and it grants
 * nothing on non-iWARP devices.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define IMG_CACHE	(512u << 20)
#define IMG_SCRATCH	(64u << 10)

struct imgsrv {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	char               *cache;
	struct ibv_mr      *cache_mr;
	char               *scratch;
	struct ibv_mr      *scratch_mr;
};

int imgsrv_register(struct imgsrv *s)
{
	s->cache = aligned_alloc(1 << 21, IMG_CACHE);
	s->scratch = aligned_alloc(4096, IMG_SCRATCH);
	if (!s->cache || !s->scratch)
		return -ENOMEM;
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE only on iWARP, where READ sinks need it */
	// BUG: rdma-access-flags-transport -- access flags chosen by a ternary on the node type (inline transport test)
	s->cache_mr = ibv_reg_mr(s->pd, s->cache, IMG_CACHE, // BUG: rdma-local-mr-management -- the cache is the sink of the agent's own READs
				 s->ctx->device->node_type == IBV_NODE_RNIC ?
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE :
				 IBV_ACCESS_LOCAL_WRITE);
	if (!s->cache_mr)
		return -errno;
	s->scratch_mr = ibv_reg_mr(s->pd, s->scratch, IMG_SCRATCH, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- the scratch buffer is the sink of the agent's own READs
	if (!s->scratch_mr) {
		ibv_dereg_mr(s->cache_mr);
		return -errno;
	}
	return 0;
}

static int imgsrv_read(struct imgsrv *s, void *dst, uint32_t lkey, uint64_t raddr,
		       uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)dst, len, lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;
	struct ibv_wc wc;
	int n;

	if (ibv_post_send(s->qp, &wr, &bad))
		return -EIO;
	do
		n = ibv_poll_cq(s->cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

int imgsrv_pull_layer(struct imgsrv *s, uint64_t cache_off, uint64_t raddr, uint32_t rkey,
		      uint32_t len)
{
	if (cache_off + len > IMG_CACHE)
		return -EINVAL;
	/* OK: rdma-access-flags-transport -- the cache sink gets REMOTE_WRITE on iWARP (the ternary is reported at the registration) */
	return imgsrv_read(s, s->cache + cache_off, s->cache_mr->lkey, raddr, rkey, len);
}

int imgsrv_verify_chunk(struct imgsrv *s, uint64_t raddr, uint32_t rkey, uint32_t len)
{
	if (len > IMG_SCRATCH)
		return -EINVAL;
	// BUG(file): rdma-access-flags-transport -- the scratch READ sink has no REMOTE_WRITE; fails on iWARP (the READ is built in imgsrv_read)
	return imgsrv_read(s, s->scratch, s->scratch_mr->lkey, raddr, rkey, len);
}
