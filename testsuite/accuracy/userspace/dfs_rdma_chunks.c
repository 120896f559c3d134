/*
 * dfs_rdma_chunks.c - chunk registration of a distributed file system
 * client's RDMA transport (RPC-over-RDMA style).
 *
 * Every data segment of an RPC is handed to the server as a chunk: a
 * type-2 memory window bound over the segment, written into the call
 * header as (handle, length, offset).  Segments in memory the application
 * registered with dfs_mem_register() are bound in place; anything else is
 * staged through the client's bounce pool.  The server answers with
 * SEND_WITH_INV when it can; other windows get a LOCAL_INV.  READDIR
 * replies land in one long-lived buffer whose window is re-armed.
 */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define DFS_MAX_SEGS        4
#define DFS_BOUNCE_SIZE     (64 * 1024)
#define DFS_MAX_WINDOWS     1024
#define DFS_READDIR_SIZE    (256 * 1024)

struct dfs_window {
	struct dfs_window   *next;
	struct ibv_mw       *mw;
	uint32_t             rkey;
	unsigned int         uses;
	bool                 bound;
	struct ibv_send_wr   bind_wr;
	struct ibv_send_wr   inv_wr;
};

struct dfs_seg {
	char                *buf;
	uint32_t             len;
	char                *bounce;        /* staging copy, or NULL */
	struct dfs_window   *w;
};

struct dfs_chunk_wire {
	uint32_t             handle;
	uint32_t             length;
	uint64_t             offset;
};

struct dfs_req {
	struct dfs_client   *c;
	uint32_t             xid;
	int                  nsegs;
	bool                 server_writes;
	struct dfs_seg       segs[DFS_MAX_SEGS];
	struct dfs_chunk_wire *chunks;      /* in the call header */
	struct ibv_sge       send_sge;
	struct ibv_send_wr   send_wr;
	unsigned int         rr_wc_flags;
	uint32_t             rr_inv_rkey;
};

struct dfs_client {
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	unsigned int         max_reqs;
	char                *bounce_base;
	struct ibv_mr       *bounce_mr;
	struct ibv_mr       *app_mr;
	struct ibv_mr       *hdr_mr;
	struct dfs_window   *free_windows;
	unsigned int         nwindows;
	struct dfs_window   *readdir_w;
	char                *readdir_buf;
};

char *dfs_bounce_get(struct dfs_client *c, uint32_t len);
void dfs_bounce_put(struct dfs_client *c, char *bounce);

int dfs_create_qp(struct dfs_client *c)
{
	struct ibv_qp_init_attr attr = { .send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC };

	// BUG(file): rdma-send-queue-undersized -- the factor counts the binds and the call SEND but not the up to four LOCAL_INVs a request posts
	attr.cap.max_send_wr = c->max_reqs * (DFS_MAX_SEGS + 1);	// BUG: rdma-send-queue-manual-factor -- hand-made factor for window binds over max_reqs
	attr.cap.max_recv_wr = c->max_reqs;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

int dfs_bounce_pool_init(struct dfs_client *c, size_t len)
{
	c->bounce_base = aligned_alloc(4096, len);
	if (!c->bounce_base)
		return -ENOMEM;
	c->bounce_mr = ibv_reg_mr(c->pd, c->bounce_base, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);	// BUG: rdma-local-mr-management -- staging copies are exposed to the server through windows
	if (!c->bounce_mr) {
		free(c->bounce_base);
		return -errno;
	}
	return 0;
}

int dfs_mem_register(struct dfs_client *c, void *addr, size_t len)
{
	c->app_mr = ibv_reg_mr(c->pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);	// BUG: rdma-local-mr-management -- application memory exposed to the server through windows
	return c->app_mr ? 0 : -errno;
}

static struct dfs_window *dfs_window_get(struct dfs_client *c)
{
	struct dfs_window *w = c->free_windows;

	if (w) {
		c->free_windows = w->next;
		return w;
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);	// BUG: rdma-local-mr-management -- windows allocated on demand to expose chunks
	if (!w->mw) {
		free(w);
		return NULL;
	}
	if (c->nwindows >= DFS_MAX_WINDOWS) {
		free(w);		// BUG: rdma-mr-leak -- the window just allocated is freed with its holder, never deallocated
		return NULL;
	}
	c->nwindows++;
	w->rkey = w->mw->rkey;
	return w;
}

static void dfs_window_put(struct dfs_client *c, struct dfs_window *w)
{
	w->bound = false;
	w->next = c->free_windows;
	c->free_windows = w;
}

/* the first bind of a fresh window may use the allocation key; never again */
static uint32_t dfs_next_key(struct dfs_window *w)
{
	if (w->uses++ == 0)
		return w->mw->rkey;
	return ibv_inc_rkey(w->rkey);
}

static void dfs_build_bind(struct dfs_client *c, struct dfs_seg *seg, bool server_writes)
{
	struct dfs_window *w = seg->w;

	memset(&w->bind_wr, 0, sizeof(w->bind_wr));
	w->bind_wr.wr_id = (uintptr_t)w;
	w->bind_wr.opcode = IBV_WR_BIND_MW;	// BUG: rdma-local-mr-management -- hand-bound window per chunk
	w->bind_wr.bind_mw.mw = w->mw;
	/* OK: rdma-rkey-reuse -- dfs_next_key() rotates the key, except for the first bind of a new window */
	w->rkey = dfs_next_key(w);
	w->bind_wr.bind_mw.rkey = w->rkey;
	/* OK: rdma-access-flags-invalid -- both the bounce pool and the application region have LOCAL_WRITE and MW_BIND */
	w->bind_wr.bind_mw.bind_info.mr = seg->bounce ? c->bounce_mr : c->app_mr;
	w->bind_wr.bind_mw.bind_info.addr = (uintptr_t)(seg->bounce ? seg->bounce : seg->buf);
	w->bind_wr.bind_mw.bind_info.length = seg->len;
	w->bind_wr.bind_mw.bind_info.mw_access_flags =
		server_writes ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	w->bound = true;
}

int dfs_call(struct dfs_client *c, struct dfs_req *req)
{
	struct ibv_send_wr *first = NULL, **prev = &first, *bad;
	int i;

	for (i = 0; i < req->nsegs; i++) {
		struct dfs_seg *seg = &req->segs[i];

		seg->w = dfs_window_get(c);
		if (!seg->w)
			goto err_windows;
		if (!req->server_writes && ((uintptr_t)seg->buf & 63)) {
			seg->bounce = dfs_bounce_get(c, seg->len);
			if (!seg->bounce) {
				dfs_window_put(c, seg->w);
				goto err_windows;
			}
			memcpy(seg->bounce, seg->buf, seg->len);
		}
		dfs_build_bind(c, seg, req->server_writes);
		*prev = &seg->w->bind_wr;
		prev = &seg->w->bind_wr.next;
		req->chunks[i].handle = htobe32(seg->w->rkey);
		req->chunks[i].length = htobe32(seg->len);
		req->chunks[i].offset = htobe64(seg->w->bind_wr.bind_mw.bind_info.addr);
	}
	req->send_wr.wr_id = (uintptr_t)req;
	req->send_wr.opcode = IBV_WR_SEND;
	req->send_wr.send_flags = IBV_SEND_SIGNALED;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.next = NULL;
	*prev = &req->send_wr;

	if (ibv_post_send(c->qp, first, &bad)) {
		/* OK: rdma-invalidation-leak -- nothing was posted, so no window was bound */
		i = req->nsegs;
		goto err_windows;
	}
	return 0;

err_windows:
	while (i--) {
		if (req->segs[i].bounce)
			dfs_bounce_put(c, req->segs[i].bounce);
		req->segs[i].bounce = NULL;
		dfs_window_put(c, req->segs[i].w);
	}
	return -EAGAIN;
}

static bool dfs_seg_invalidated(const struct dfs_seg *seg, uint32_t inv_rkey)
{
	return seg->w->rkey == inv_rkey;
}

/* reply arrived; release the chunks the server invalidated, LOCAL_INV the rest */
void dfs_reply_done(struct dfs_client *c, struct dfs_req *req)
{
	struct ibv_send_wr *bad;
	int i;

	for (i = 0; i < req->nsegs; i++) {
		struct dfs_seg *seg = &req->segs[i];

		/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is handed to a helper that compares it with the window's */
		if ((req->rr_wc_flags & IBV_WC_WITH_INV) && dfs_seg_invalidated(seg, req->rr_inv_rkey)) {
			if (seg->bounce)
				dfs_bounce_put(c, seg->bounce);
			dfs_window_put(c, seg->w);	/* OK: rdma-invalidation-leak -- the server invalidated exactly this window */
			continue;
		}
		memset(&seg->w->inv_wr, 0, sizeof(seg->w->inv_wr));
		seg->w->inv_wr.wr_id = (uintptr_t)seg;
		seg->w->inv_wr.opcode = IBV_WR_LOCAL_INV;
		seg->w->inv_wr.invalidate_rkey = seg->w->rkey;
		if (ibv_post_send(c->qp, &seg->w->inv_wr, &bad))
			continue;
		if (seg->bounce)
			dfs_bounce_put(c, seg->bounce);	// BUG: rdma-unmap-before-invalidate -- the bounce memory behind the window is recycled right after an unsignaled LOCAL_INV
		seg->bounce = NULL;
	}
}

/* small replies without data: the server invalidated the only chunk */
void dfs_reply_fast(struct dfs_client *c, struct dfs_req *req)
{
	if (req->nsegs == 1 && (req->rr_wc_flags & IBV_WC_WITH_INV)) {	// BUG: rdma-remote-invalidate-unchecked -- releases the chunk for any invalidated rkey
		dfs_window_put(c, req->segs[0].w);
		req->segs[0].w = NULL;
	}
}

/* the call timed out: give the segments back to the caller */
void dfs_call_timeout(struct dfs_client *c, struct dfs_req *req)
{
	int i;

	for (i = 0; i < req->nsegs; i++) {
		if (req->segs[i].bounce)
			dfs_bounce_put(c, req->segs[i].bounce);	// BUG: rdma-invalidation-leak -- the window over the bounce copy is still bound for the server
		req->segs[i].bounce = NULL;
	}
}

int dfs_readdir_setup(struct dfs_client *c)
{
	c->readdir_buf = dfs_bounce_get(c, DFS_READDIR_SIZE);
	if (!c->readdir_buf)
		return -ENOMEM;
	c->readdir_w = dfs_window_get(c);
	return c->readdir_w ? 0 : -ENOMEM;
}

/* re-arm the READDIR window after the reply was consumed */
int dfs_readdir_rearm(struct dfs_client *c)
{
	struct dfs_window *w = c->readdir_w;
	struct ibv_send_wr *bad;

	memset(&w->bind_wr, 0, sizeof(w->bind_wr));
	w->bind_wr.opcode = IBV_WR_BIND_MW;	// BUG: rdma-local-mr-management -- window bound over the READDIR buffer
	w->bind_wr.bind_mw.mw = w->mw;
	ibv_inc_rkey(w->rkey);
	w->bind_wr.bind_mw.rkey = w->rkey;	// BUG: rdma-rkey-reuse -- the rotated key is discarded; the window is bound again under the key the server already used
	w->bind_wr.bind_mw.bind_info.mr = c->bounce_mr;
	w->bind_wr.bind_mw.bind_info.addr = (uintptr_t)c->readdir_buf;
	w->bind_wr.bind_mw.bind_info.length = DFS_READDIR_SIZE;
	w->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	return ibv_post_send(c->qp, &w->bind_wr, &bad);
}

/* fsync path: drop a chunk synchronously */
int dfs_seg_release_sync(struct dfs_client *c, struct dfs_seg *seg)
{
	struct ibv_send_wr inv = { 0 }, *bad;
	struct ibv_wc wc;
	int n;

	inv.wr_id = (uintptr_t)seg;
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.send_flags = IBV_SEND_SIGNALED;
	inv.invalidate_rkey = seg->w->rkey;
	if (ibv_post_send(c->qp, &inv, &bad))
		return -EIO;
	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != (uintptr_t)seg));
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	if (seg->bounce)
		dfs_bounce_put(c, seg->bounce);	/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completion was reaped above */
	seg->bounce = NULL;
	dfs_window_put(c, seg->w);
	return 0;
}

void dfs_recv_reply(struct dfs_client *c, struct ibv_wc *wc, struct dfs_req *req)
{
	req->rr_wc_flags = wc->wc_flags;
	req->rr_inv_rkey = wc->invalidated_rkey;
	if (req->nsegs == 1 && wc->byte_len <= 64)
		dfs_reply_fast(c, req);
	else
		dfs_reply_done(c, req);
}

void dfs_client_destroy(struct dfs_client *c)
{
	struct dfs_window *w;

	ibv_destroy_qp(c->qp);
	while ((w = c->free_windows)) {
		c->free_windows = w->next;
		ibv_dealloc_mw(w->mw);
		free(w);	/* OK: rdma-mr-leak -- the window is deallocated before its holder is freed */
	}
	if (c->app_mr)
		ibv_dereg_mr(c->app_mr);
	ibv_dereg_mr(c->bounce_mr);
	free(c->bounce_base);	// BUG: rdma-invalidation-leak -- the READDIR window is never on the free list and is still bound over the bounce pool freed here
}
