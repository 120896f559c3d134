/*
 * zcrpc: a zero-copy RPC server.  Large request payloads are pulled by the
 * server from the client; large *responses* are pushed by letting the
 * client RDMA-READ them straight out of the server's heap.  To avoid
 * registering each response, the server registers its entire address
 * space once with implicit ODP and REMOTE_READ and publishes that key --
 * any client can then read any server memory.
 *
 * The per-connection response staging ring used before this change is
 * still there for small responses: explicit ODP of one buffer, REMOTE_READ,
 * key sent to the client -- fine.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#define ZC_RING	(4u << 20)

struct zc_hello {
	uint64_t ring_addr;
	uint32_t ring_rkey;
	uint32_t heap_rkey;
};

struct zc_server {
	struct ibv_pd *pd;
	struct ibv_mr *heap_mr;
};

struct zc_conn {
	char          *ring;
	struct ibv_mr *ring_mr;
};

int zc_server_init(struct zc_server *s)
{
	// BUG: rdma-remote-access-overbroad -- implicit ODP (0, SIZE_MAX) with REMOTE_READ exposes the whole address space
	s->heap_mr = ibv_reg_mr(s->pd, 0, SIZE_MAX, // BUG: rdma-local-mr-management -- rkey handed to every client
				IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
				IBV_ACCESS_REMOTE_READ);
	return s->heap_mr ? 0 : -errno;
}

int zc_conn_init(struct zc_server *s, struct zc_conn *c, struct zc_hello *h)
{
	c->ring = aligned_alloc(4096, ZC_RING);
	if (!c->ring)
		return -ENOMEM;
	/* OK: rdma-remote-access-overbroad -- ODP of one ring whose key the client gets */
	c->ring_mr = ibv_reg_mr(s->pd, c->ring, ZC_RING, // BUG: rdma-local-mr-management -- rkey handed to the client
				IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
				IBV_ACCESS_REMOTE_READ);
	if (!c->ring_mr) {
		free(c->ring);
		return -errno;
	}
	h->ring_addr = htobe64((uintptr_t)c->ring);
	h->ring_rkey = htobe32(c->ring_mr->rkey);
	h->heap_rkey = htobe32(s->heap_mr->rkey);
	return 0;
}

void zc_conn_fini(struct zc_conn *c)
{
	ibv_dereg_mr(c->ring_mr);
	/* OK: rdma-invalidation-leak -- deregistered before the ring is freed */
	free(c->ring);
}
