/*
 * tc_lru_seg.c - blkcache segments: allocation, registration, LRU order,
 * block index and shrinking under memory pressure.
 *
 * A segment is registered once when the cache grows and stays registered
 * until it is destroyed; clients read its blocks with its key.  The shrink
 * path open-codes segment teardown and forgets the registration.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "tc_lru.h"

#define LRU_INDEX_SIZE	(1u << 16)

struct lru_index_ent {
	uint64_t	key;
	struct lru_seg	*seg;
	char		*block;
};

static struct lru_index_ent lru_index[LRU_INDEX_SIZE];

static void lru_unlink(struct lru_srv *srv, struct lru_seg *seg)
{
	if (seg->prev)
		seg->prev->next = seg->next;
	else
		srv->lru_head = seg->next;
	if (seg->next)
		seg->next->prev = seg->prev;
	else
		srv->lru_tail = seg->prev;
	seg->prev = seg->next = NULL;
}

static void lru_link_head(struct lru_srv *srv, struct lru_seg *seg)
{
	seg->prev = NULL;
	seg->next = srv->lru_head;
	if (srv->lru_head)
		srv->lru_head->prev = seg;
	srv->lru_head = seg;
	if (!srv->lru_tail)
		srv->lru_tail = seg;
}

void lru_touch(struct lru_srv *srv, struct lru_seg *seg)
{
	seg->last_use = ++srv->clock;
	if (srv->lru_head == seg)
		return;
	lru_unlink(srv, seg);
	lru_link_head(srv, seg);
}

static void lru_forget(struct lru_srv *srv, struct lru_seg *seg)
{
	unsigned int i;

	for (i = 0; i < LRU_INDEX_SIZE; i++)
		if (lru_index[i].seg == seg)
			memset(&lru_index[i], 0, sizeof(lru_index[i]));
	for (i = 0; i < srv->nsegs; i++) {
		if (srv->segs[i] == seg) {
			srv->segs[i] = srv->segs[--srv->nsegs];
			break;
		}
	}
}

struct lru_seg *lru_seg_create(struct lru_srv *srv)
{
	struct lru_seg *seg;

	if (srv->nsegs >= srv->max_segs)
		return NULL;
	seg = calloc(1, sizeof(*seg));
	if (!seg)
		return NULL;
	seg->base = aligned_alloc(2u << 20, LRU_SEG_SIZE);
	if (!seg->base) {
		free(seg);
		return NULL;
	}

	/* BUG: rdma-local-mr-management -- clients get the segment's rkey in GET responses, and its lkey is the sink of the server's PUT reads */
	seg->mr = ibv_reg_mr(srv->pd, seg->base, LRU_SEG_SIZE, // OK: rdma-registration-in-datapath -- a segment is registered when the cache grows, then kept until it is destroyed
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			     IBV_ACCESS_REMOTE_WRITE); // OK: rdma-remote-access-overbroad -- remote read is used by clients with the key from tc_lru_io.c; remote write is the iWARP read sink
	if (!seg->mr) {
		free(seg->base);
		free(seg);
		return NULL;
	}
	srv->segs[srv->nsegs++] = seg;
	lru_link_head(srv, seg);
	seg->last_use = ++srv->clock;
	return seg;
}

void lru_seg_destroy(struct lru_srv *srv, struct lru_seg *seg)
{
	lru_unlink(srv, seg);
	lru_forget(srv, seg);
	ibv_dereg_mr(seg->mr); // OK: rdma-mr-leak -- the registration goes with the segment
	free(seg->base);
	free(seg);
}

/* drop cold segments until at most @target remain; returns how many went */
unsigned int lru_seg_shrink(struct lru_srv *srv, unsigned int target)
{
	struct lru_seg *seg;
	unsigned int dropped = 0;

	while (srv->nsegs > target && (seg = srv->lru_tail) != NULL) {
		if (seg->readers)
			break;		/* clients still reading the coldest one */
		lru_unlink(srv, seg);
		lru_forget(srv, seg);
		free(seg->base);
		free(seg); // BUG: rdma-mr-leak -- the segment is freed with its MR still registered
		dropped++;
	}
	return dropped;
}

char *lru_block_alloc(struct lru_srv *srv, struct lru_seg **segp)
{
	struct lru_seg *seg = srv->lru_head;

	if (!seg || seg->next_free >= LRU_BLOCKS_PER_SEG) {
		seg = lru_seg_create(srv);
		if (!seg)
			return NULL;
	}
	*segp = seg;
	return seg->base + (size_t)seg->next_free++ * LRU_BLOCK_SIZE;
}

struct lru_seg *lru_block_lookup(struct lru_srv *srv, uint64_t key, char **blockp)
{
	struct lru_index_ent *e = &lru_index[key % LRU_INDEX_SIZE];

	if (!e->seg || e->key != key)
		return NULL;
	lru_touch(srv, e->seg);
	*blockp = e->block;
	return e->seg;
}

void lru_block_index(struct lru_srv *srv, uint64_t key, struct lru_seg *seg, char *block)
{
	struct lru_index_ent *e = &lru_index[key % LRU_INDEX_SIZE];

	(void)srv;
	e->key = key;
	e->seg = seg;
	e->block = block;
}

void *lru_blob_alloc(size_t len)
{
	return aligned_alloc(LRU_BLOCK_SIZE, (len + LRU_BLOCK_SIZE - 1) & ~(size_t)(LRU_BLOCK_SIZE - 1));
}

void lru_blob_insert(struct lru_srv *srv, uint64_t key, void *blob, size_t len)
{
	struct lru_seg *seg;
	size_t off;
	char *block;

	/* large values are split over blocks; the blob is only a landing area */
	for (off = 0; off < len; off += LRU_BLOCK_SIZE) {
		block = lru_block_alloc(srv, &seg);
		if (!block)
			break;
		memcpy(block, (char *)blob + off, len - off < LRU_BLOCK_SIZE ? len - off : LRU_BLOCK_SIZE);
		lru_block_index(srv, key + off / LRU_BLOCK_SIZE, seg, block);
	}
	free(blob);
}
