/*
 * dmaq: a "remote DMA queue" library: the application enqueues buffers
 * from a pinned buffer pool; each buffer is exposed to the remote DMA
 * engine through a type-2 window and the engine answers with
 * SEND_WITH_INV.  Completions are compared against the buffer's key; on a
 * mismatch (or no invalidation) the library invalidates locally.
 *
 * Not correct: the local invalidation is posted with the extended API
 * without IBV_SEND_SIGNALED, and the buffer is returned to the pool in the
 * same breath; the engine may still write into it until the LOCAL_INV
 * executes, and the pool hands it to the next user.
 * Correct: the remote-invalidation check; key rotation.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct dmaq_buf {
	struct dmaq_buf *next;
	struct ibv_mw   *mw;
	uint32_t         key;
	void            *mem;
	uint32_t         len;
};

struct dmaq {
	struct ibv_qp_ex *qpx;
	struct ibv_mr    *pool_mr;	/* LOCAL_WRITE | MW_BIND */
	struct dmaq_buf  *pool;
};

static void dmaq_pool_put(struct dmaq *q, struct dmaq_buf *b)
{
	b->next = q->pool;
	q->pool = b;
}

int dmaq_enqueue(struct dmaq *q, struct dmaq_buf *b, uint32_t *key)
{
	struct ibv_mw_bind_info bi = {
		.mr = q->pool_mr, .addr = (uintptr_t)b->mem, .length = b->len,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	b->key = ibv_inc_rkey(b->key);
	ibv_wr_start(q->qpx);
	q->qpx->wr_id = (uintptr_t)b;
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* OK: rdma-rkey-reuse -- rotated just above */
	ibv_wr_bind_mw(q->qpx, b->mw, b->key, &bi); // BUG: rdma-local-mr-management -- per-buffer window bind done by the ULP
	if (ibv_wr_complete(q->qpx))
		return -EIO;
	*key = b->key;
	return 0;
}

void dmaq_filled(struct dmaq *q, struct dmaq_buf *b, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated key is compared with the buffer's */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == b->key) {
		dmaq_pool_put(q, b);
		return;
	}
	ibv_wr_start(q->qpx);
	q->qpx->wr_id = 0;
	q->qpx->wr_flags = 0;
	ibv_wr_local_inv(q->qpx, b->key);
	if (ibv_wr_complete(q->qpx))
		return;
	// BUG: rdma-unmap-before-invalidate -- back to the pool right after an unsignaled LOCAL_INV
	dmaq_pool_put(q, b);
}
