/*
 * kvsnap: point-in-time snapshots of a key-value store, served to backup
 * clients with one-sided READs.  A snapshot is a frozen copy of the store
 * registered REMOTE_READ; its (addr, rkey) goes to the backup client.
 *
 * Snapshots are reference counted.  snap_put() drops the last reference:
 * the memory is returned immediately "to keep the footprint low" and the
 * MR is queued for deregistration by the garbage collector that runs once
 * a second.  Until the collector runs, a backup client that still holds
 * the key reads memory malloc may already have reused for other data.
 *
 * Correct: snap_abort() (used when the client never connects) deregisters
 * before freeing; the key really goes to a client.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct snap {
	struct snap   *gc_next;
	char          *copy;
	size_t         len;
	struct ibv_mr *mr;
	int            refs;
};

struct snap_desc {
	uint64_t addr;
	uint32_t rkey;
	uint32_t pad;
	uint64_t len;
};

struct kvsnap {
	struct ibv_pd *pd;
	struct snap   *gc_list;
};

struct snap *snap_create(struct kvsnap *k, const void *store, size_t len, struct snap_desc *d)
{
	struct snap *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->copy = malloc(len);
	if (!s->copy)
		goto err;
	memcpy(s->copy, store, len);
	s->len = len;
	/* OK: rdma-remote-access-overbroad -- the key is sent to the backup client */
	s->mr = ibv_reg_mr(k->pd, s->copy, len, IBV_ACCESS_REMOTE_READ); // BUG: rdma-local-mr-management -- rkey handed to the backup client
	if (!s->mr)
		goto err_copy;
	s->refs = 1;
	d->addr = htobe64((uintptr_t)s->copy);
	d->rkey = htobe32(s->mr->rkey);
	d->len = htobe64(len);
	return s;
err_copy:
	free(s->copy);
err:
	free(s);
	return NULL;
}

void snap_put(struct kvsnap *k, struct snap *s)
{
	if (--s->refs)
		return;
	// BUG: rdma-invalidation-leak -- the snapshot memory is freed while its MR (REMOTE_READ, key at the client) is still registered
	free(s->copy);
	s->copy = NULL;
	s->gc_next = k->gc_list;
	k->gc_list = s;
}

void snap_gc(struct kvsnap *k)
{
	struct snap *s;

	while ((s = k->gc_list)) {
		k->gc_list = s->gc_next;
		ibv_dereg_mr(s->mr);
		free(s);
	}
}

void snap_abort(struct snap *s)
{
	ibv_dereg_mr(s->mr);
	/* OK: rdma-invalidation-leak -- deregistered before the memory is freed */
	free(s->copy);
	free(s);
}
