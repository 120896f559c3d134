/*
 * chunkd: a chunk server that RDMA-READs client data into its chunk cache
 * and lets clients RDMA-READ cached chunks.  The cache is registered once
 * per device.  Whether cache memory needs REMOTE_WRITE is decided by
 * looking at the device's transport in this file: a local boolean computed
 * from transport_type == IBV_TRANSPORT_IWARP selects the flags.  That
 * works today, but it is the device knowledge the transport check asks to
 * keep in one place (a transport-independent access helper) instead of
 * repeating it in every ULP.
 *
 * The same device test also picks a deeper send queue on iWARP NICs (their
 * READs are split more often); that test does not decide access flags and
 * is fine.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNKD_CACHE	(256u << 20)
#define CHUNKD_DEPTH	128

struct chunkd_dev {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	char               *cache;
	struct ibv_mr      *cache_mr;
};

struct chunkd_announce {
	uint64_t cache_addr;
	uint32_t cache_rkey;
	uint32_t cache_len;
};

int chunkd_dev_init(struct chunkd_dev *d, struct chunkd_announce *ann)
{
	bool iwarp = d->ctx->device->transport_type == IBV_TRANSPORT_IWARP;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;

	if (iwarp)
		access |= IBV_ACCESS_REMOTE_WRITE;	/* READ sinks on iWARP */

	d->cache = aligned_alloc(1 << 21, CHUNKD_CACHE);
	if (!d->cache)
		return -ENOMEM;
	// BUG: rdma-access-flags-transport -- flags chosen from a local boolean computed from an inline transport test
	d->cache_mr = ibv_reg_mr(d->pd, d->cache, CHUNKD_CACHE, access); // BUG: rdma-local-mr-management -- rkey announced to clients and lkey used for the server's own READs
	if (!d->cache_mr) {
		free(d->cache);
		return -errno;
	}
	/* OK: rdma-remote-access-overbroad -- the cache's key is announced to clients */
	ann->cache_addr = (uintptr_t)d->cache;
	ann->cache_rkey = d->cache_mr->rkey;
	ann->cache_len = CHUNKD_CACHE;
	return 0;
}

struct ibv_qp *chunkd_create_qp(struct chunkd_dev *d)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = d->cq;
	attr.recv_cq = d->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 1;
	/* OK: rdma-access-flags-transport -- a transport test that sizes a queue, not access flags */
	attr.cap.max_send_wr = d->ctx->device->node_type == IBV_NODE_RNIC ?
			       2 * CHUNKD_DEPTH : CHUNKD_DEPTH;
	attr.cap.max_recv_wr = CHUNKD_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	return ibv_create_qp(d->pd, &attr);
}

int chunkd_fetch(struct chunkd_dev *d, struct ibv_qp *qp, uint64_t off,
		 uint64_t raddr, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)(d->cache + off), len, d->cache_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = off, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_READ,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;

	if (off + len > CHUNKD_CACHE)
		return -EINVAL;
	/* OK: rdma-access-flags-transport -- on iWARP the sink was given REMOTE_WRITE (the inline test is reported at the registration) */
	return ibv_post_send(qp, &wr, &bad);
}
