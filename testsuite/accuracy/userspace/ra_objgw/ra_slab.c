/*
 * ra_slab.c -- slab allocator of registered chunks for the object gateway.
 *
 * A slab is one aligned allocation cut into chunk_size pieces; each piece is
 * registered by itself with the class's access rights.  Free chunks sit on
 * the class free list.  objgw_chunk_put() re-registers a chunk whose rkey was
 * lent to a client before the chunk can be handed out again.  Jumbo buffers
 * (objects larger than a wire chunk) are allocated and registered per
 * object and freed when the transfer is done.
 *
 * Right: growing a class unwinds every registration it made, putting a lent
 * chunk back replaces its registration first, trimming and destroying a
 * class deregister before freeing, objgw_jumbo_free().
 * Wrong: objgw_jumbo_alloc() leaks its registration when the descriptor
 * cannot be allocated, and frees the buffer it still exposes for remote
 * access.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "ra_objgw.h"

static int objgw_slab_grow(struct objgw_slab_class *cls)
{
	struct objgw_slab *s;
	uint32_t i;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cls = cls;
	s->chunks = calloc(cls->chunks_per_slab, sizeof(*s->chunks));
	s->mem = aligned_alloc(4096, cls->chunk_size * cls->chunks_per_slab);
	if (!s->chunks || !s->mem)
		goto err_free;

	for (i = 0; i < cls->chunks_per_slab; i++) {
		struct objgw_chunk *ch = &s->chunks[i];

		ch->slab = s;
		ch->buf = (char *)s->mem + (size_t)i * cls->chunk_size;
		ch->len = cls->chunk_size;
		ch->mr = ibv_reg_mr(cls->pd, ch->buf, ch->len, cls->access);
		if (!ch->mr)
			goto err_dereg;
	}

	for (i = 0; i < cls->chunks_per_slab; i++)
		TAILQ_INSERT_TAIL(&cls->free_chunks, &s->chunks[i], link);
	s->nchunks = s->nfree = cls->chunks_per_slab;
	TAILQ_INSERT_TAIL(&cls->slabs, s, link);
	cls->nslabs++;
	return 0;

err_dereg:
	while (i-- > 0)		// OK: rdma-mr-leak -- chunk i failed to register; every earlier chunk is deregistered
		ibv_dereg_mr(s->chunks[i].mr);
err_free:
	free(s->mem);		// OK: rdma-invalidation-leak -- every registration over the slab is gone by now
	free(s->chunks);
	free(s);
	return -ENOMEM;
}

int objgw_slab_class_init(struct objgw_slab_class *cls, const char *name,
			  struct ibv_pd *pd, size_t chunk_size,
			  uint32_t chunks_per_slab, int access)
{
	memset(cls, 0, sizeof(*cls));
	cls->name = name;
	cls->pd = pd;
	cls->chunk_size = chunk_size;
	cls->chunks_per_slab = chunks_per_slab;
	cls->min_slabs = 1;
	cls->access = access;
	TAILQ_INIT(&cls->slabs);
	TAILQ_INIT(&cls->free_chunks);
	return objgw_slab_grow(cls);
}

struct objgw_chunk *objgw_chunk_get(struct objgw_slab_class *cls)
{
	struct objgw_chunk *ch = TAILQ_FIRST(&cls->free_chunks);

	if (!ch) {
		if (objgw_slab_grow(cls))
			return NULL;
		ch = TAILQ_FIRST(&cls->free_chunks);
	}
	TAILQ_REMOVE(&cls->free_chunks, ch, link);
	ch->slab->nfree--;
	return ch;
}

void objgw_chunk_put(struct objgw_chunk *ch)
{
	struct objgw_slab *s = ch->slab;
	struct objgw_slab_class *cls = s->cls;

	if (ch->exposed) {
		/* the borrower's rkey must not reach the next borrower */
		ibv_dereg_mr(ch->mr);
		ch->mr = ibv_reg_mr(cls->pd, ch->buf, ch->len, cls->access);	// OK: rdma-mr-leak -- replaces the registration deregistered just above
		ch->exposed = false;
		if (!ch->mr) {
			ch->dead = true;	/* out of circulation until the class goes */
			return;
		}
	}
	TAILQ_INSERT_HEAD(&cls->free_chunks, ch, link);	// OK: rdma-invalidation-leak -- a lent chunk's old key died with its deregistration above
	s->nfree++;
}

static void objgw_slab_release(struct objgw_slab *s)
{
	uint32_t i;

	for (i = 0; i < s->nchunks; i++)
		if (s->chunks[i].mr)
			ibv_dereg_mr(s->chunks[i].mr);
	free(s->mem);		// OK: rdma-invalidation-leak -- all chunks of the slab were deregistered first
	free(s->chunks);
	free(s);
}

/* Give back slabs whose chunks are all idle, keeping min_slabs. */
void objgw_slab_trim(struct objgw_slab_class *cls)
{
	struct objgw_slab *s, *next;
	uint32_t i;

	for (s = TAILQ_FIRST(&cls->slabs); s && cls->nslabs > cls->min_slabs; s = next) {
		next = TAILQ_NEXT(s, link);
		if (s->nfree != s->nchunks)
			continue;
		for (i = 0; i < s->nchunks; i++)
			TAILQ_REMOVE(&cls->free_chunks, &s->chunks[i], link);
		TAILQ_REMOVE(&cls->slabs, s, link);
		cls->nslabs--;
		objgw_slab_release(s);
	}
}

void objgw_slab_class_destroy(struct objgw_slab_class *cls)
{
	struct objgw_slab *s;

	while ((s = TAILQ_FIRST(&cls->slabs)) != NULL) {
		TAILQ_REMOVE(&cls->slabs, s, link);
		objgw_slab_release(s);
	}
	TAILQ_INIT(&cls->free_chunks);
	cls->nslabs = 0;
}

int objgw_jumbo_alloc(struct ibv_pd *pd, size_t len, struct objgw_chunk **out)
{
	struct objgw_chunk *ch;
	struct ibv_mr *mr;
	void *buf;

	len = (len + 4095) & ~(size_t)4095;
	buf = aligned_alloc(4096, len);
	if (!buf)
		return -ENOMEM;
	mr = ibv_reg_mr(pd, buf, len, OBJGW_WIRE_ACCESS);
	if (!mr) {
		free(buf);
		return -errno;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch) {
		free(buf);	// BUG: rdma-invalidation-leak -- frees the buffer while its remote read/write registration is still live
		return -ENOMEM;	// BUG: rdma-mr-leak -- 'mr' is never deregistered on this path
	}
	ch->buf = buf;
	ch->len = len;
	ch->mr = mr;
	*out = ch;
	return 0;
}

void objgw_jumbo_free(struct objgw_chunk *ch)
{
	ibv_dereg_mr(ch->mr);
	free(ch->buf);		// OK: rdma-invalidation-leak -- deregistered first, the key is dead
	free(ch);
}
