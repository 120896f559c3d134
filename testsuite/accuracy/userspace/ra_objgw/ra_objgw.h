/*
 * ra_objgw.h -- object-storage gateway, shared definitions.
 *
 * The gateway stages object data in chunks carved out of slabs.  Every chunk
 * has its own memory registration so that it can be lent to one client at a
 * time: wire chunks are registered with remote read/write (a client
 * RDMA-WRITEs PUT payloads into its chunk and RDMA-READs GET payloads out of
 * it), log chunks are local-only and carry the replication stream.  Objects
 * larger than a chunk get a dedicated "jumbo" buffer with its own MR.
 *
 * A wire chunk that was lent out is re-registered before it goes back on the
 * free list (objgw_chunk_put), so the next borrower gets a fresh rkey and the
 * previous borrower's key is dead.  Each connection also exposes a small
 * progress page the client polls with RDMA READ.
 *
 * ra_slab.c      slab classes, chunk get/put, trim, jumbo buffers
 * ra_gw_conn.c   rdma_cm connections, PUT/GET protocol, completions
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-local-mr-management,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked
 *   -- not reviewed in this program
 */
#ifndef RA_OBJGW_H
#define RA_OBJGW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define OBJGW_WIRE_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | \
				 IBV_ACCESS_REMOTE_WRITE)
#define OBJGW_LOG_ACCESS	IBV_ACCESS_LOCAL_WRITE

struct objgw_slab;

struct objgw_chunk {
	TAILQ_ENTRY(objgw_chunk)	link;
	struct objgw_slab		*slab;	/* NULL for a jumbo buffer */
	void				*buf;
	size_t				len;
	struct ibv_mr			*mr;
	bool				exposed;	/* rkey went to a client */
	bool				dead;		/* re-registration failed */
};

TAILQ_HEAD(objgw_chunk_list, objgw_chunk);

struct objgw_slab_class;

struct objgw_slab {
	TAILQ_ENTRY(objgw_slab)		link;
	struct objgw_slab_class		*cls;
	void				*mem;
	uint32_t			nchunks;
	uint32_t			nfree;
	struct objgw_chunk		*chunks;
};

struct objgw_slab_class {
	const char			*name;
	struct ibv_pd			*pd;
	size_t				chunk_size;
	uint32_t			chunks_per_slab;
	uint32_t			min_slabs;
	int				access;
	uint32_t			nslabs;
	TAILQ_HEAD(, objgw_slab)	slabs;
	struct objgw_chunk_list		free_chunks;
};

/* wire protocol */
enum objgw_op {
	OBJGW_PUT_REQ = 1, OBJGW_GET_REQ, OBJGW_GRANT, OBJGW_PUT_DONE,
	OBJGW_GET_DONE, OBJGW_NACK,
};

struct objgw_msg {
	uint16_t	op;
	uint16_t	req_id;
	uint32_t	rkey;
	uint64_t	obj_id;
	uint64_t	addr;
	uint64_t	len;
};

struct objgw_accept_data {
	uint64_t	progress_addr;
	uint32_t	progress_rkey;
	uint32_t	max_inline_obj;
};

int  objgw_slab_class_init(struct objgw_slab_class *cls, const char *name,
			   struct ibv_pd *pd, size_t chunk_size,
			   uint32_t chunks_per_slab, int access);
void objgw_slab_class_destroy(struct objgw_slab_class *cls);
struct objgw_chunk *objgw_chunk_get(struct objgw_slab_class *cls);
void objgw_chunk_put(struct objgw_chunk *ch);
void objgw_slab_trim(struct objgw_slab_class *cls);
int  objgw_jumbo_alloc(struct ibv_pd *pd, size_t len, struct objgw_chunk **out);
void objgw_jumbo_free(struct objgw_chunk *ch);

/* object backend, elsewhere */
int  backend_store(uint64_t obj_id, const void *buf, size_t len);
ssize_t backend_load(uint64_t obj_id, void *buf, size_t len);
ssize_t backend_size(uint64_t obj_id);

#endif /* RA_OBJGW_H */
