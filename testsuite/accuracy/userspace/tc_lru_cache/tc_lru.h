/*
 * tc_lru.h - shared definitions of blkcache, a block cache served over RDMA.
 *
 * Clients look blocks up with a GET and then RDMA-READ the block straight
 * out of the cache memory with the segment key returned in the response;
 * PUTs name a client buffer that the server pulls with RDMA READ.  Cache
 * memory is a list of 4 MiB segments kept in LRU order: segments are added
 * as the cache grows and dropped from the cold end under memory pressure.
 *
 * tc_lru_seg.c   segment allocation, registration, LRU and shrinking
 * tc_lru_io.c    request processing (receive ring, GET/PUT/LEASE, completions)
 * tc_lru_main.c  server setup, statistics page, main loop and teardown
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- this program is annotated for registration lifetime, placement and rights only
 */
#ifndef TC_LRU_H
#define TC_LRU_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#define LRU_SEG_SIZE		(4u << 20)
#define LRU_BLOCK_SIZE		4096u
#define LRU_BLOCKS_PER_SEG	(LRU_SEG_SIZE / LRU_BLOCK_SIZE)
#define LRU_MAX_SEGS		256
#define LRU_INITIAL_SEGS	8

enum lru_op_code {
	LRU_OP_GET = 1,
	LRU_OP_PUT,
	LRU_OP_LEASE,
};

enum lru_status {
	LRU_ST_OK = 0,
	LRU_ST_MISS,
	LRU_ST_NOSPC,
	LRU_ST_IO,
};

/* wire format, big endian */
struct lru_req {
	uint8_t		op;
	uint8_t		client;
	uint16_t	pad;
	uint32_t	rkey;		/* PUT: key of the client's source buffer */
	uint64_t	key;
	uint64_t	addr;
	uint32_t	len;
	uint32_t	tag;
};

struct lru_resp {
	uint8_t		status;
	uint8_t		pad[3];
	uint32_t	rkey;		/* GET/LEASE: key to read with */
	uint64_t	addr;
	uint32_t	len;
	uint32_t	tag;
};

struct lru_seg {
	char		*base;
	struct ibv_mr	*mr;
	unsigned int	next_free;	/* bump allocator over the blocks */
	unsigned int	readers;	/* GET responses not yet released */
	uint64_t	last_use;
	struct lru_seg	*prev, *next;	/* LRU list, head is hottest */
};

struct lru_io_ctx;

struct lru_srv {
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct lru_seg		*segs[LRU_MAX_SEGS];
	unsigned int		nsegs;
	unsigned int		max_segs;
	struct lru_seg		*lru_head, *lru_tail;
	uint64_t		clock;
	struct lru_io_ctx	*io;
};

/* tc_lru_seg.c */
struct lru_seg *lru_seg_create(struct lru_srv *srv);
void lru_seg_destroy(struct lru_srv *srv, struct lru_seg *seg);
unsigned int lru_seg_shrink(struct lru_srv *srv, unsigned int target);
char *lru_block_alloc(struct lru_srv *srv, struct lru_seg **segp);
struct lru_seg *lru_block_lookup(struct lru_srv *srv, uint64_t key, char **blockp);
void lru_block_index(struct lru_srv *srv, uint64_t key, struct lru_seg *seg, char *block);
void lru_touch(struct lru_srv *srv, struct lru_seg *seg);
void *lru_blob_alloc(size_t len);
void lru_blob_insert(struct lru_srv *srv, uint64_t key, void *blob, size_t len);

/* tc_lru_io.c */
struct lru_io_ctx *lru_io_create(struct lru_srv *srv);
void lru_io_destroy(struct lru_io_ctx *io);
int lru_io_poll(struct lru_io_ctx *io);

#endif /* TC_LRU_H */
