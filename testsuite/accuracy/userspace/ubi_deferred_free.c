/*
 * scratchd: per-request scratch buffers exposed to a compute offload
 * engine on the peer (it RDMA-WRITEs partial results into them).  Each
 * scratch buffer is malloc'd per request and exposed through a type-2
 * window over a large MW_BIND region that covers the scratch arena.
 *
 * Two ways to retire a request exist:
 *  - scratch_retire_async(): posts a signaled LOCAL_INV, parks the request
 *    on inv_pending, and frees the scratch buffer from the LOCAL_INV's
 *    completion (scratch_inv_done);
 *  - scratch_retire_now(), used on the cancel path: posts the same signaled
 *    LOCAL_INV and frees the buffer immediately, without waiting for the
 *    completion -- the engine can still write into it until the
 *    invalidation executes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct scratch_req {
	struct scratch_req *next;
	void               *buf;
	size_t              len;
	struct ibv_mw      *mw;
	uint32_t            key;
	struct ibv_send_wr  inv;
};

struct scratchd {
	struct ibv_qp      *qp;
	struct ibv_cq      *cq;
	struct scratch_req *inv_pending;
	void              (*release_buf)(void *buf, size_t len);
};

static int scratch_post_inv(struct scratchd *d, struct scratch_req *r)
{
	struct ibv_send_wr *bad;

	memset(&r->inv, 0, sizeof(r->inv));
	r->inv.wr_id = (uintptr_t)r;
	r->inv.opcode = IBV_WR_LOCAL_INV;
	r->inv.invalidate_rkey = r->key;
	r->inv.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(d->qp, &r->inv, &bad);
}

int scratch_retire_async(struct scratchd *d, struct scratch_req *r)
{
	if (scratch_post_inv(d, r))
		return -EIO;
	r->next = d->inv_pending;
	d->inv_pending = r;
	return 0;
}

void scratch_inv_done(struct scratchd *d, struct ibv_wc *wc)
{
	struct scratch_req *r = (struct scratch_req *)(uintptr_t)wc->wr_id;
	struct scratch_req **pp;

	for (pp = &d->inv_pending; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	if (wc->status != IBV_WC_SUCCESS)
		return;		/* window may be alive: leak the buffer rather than reuse it */
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- freed from the LOCAL_INV completion */
	free(r->buf);
	r->buf = NULL;
}

int scratch_retire_now(struct scratchd *d, struct scratch_req *r)
{
	if (scratch_post_inv(d, r))
		return -EIO;
	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is signaled but nothing waits for it before the buffer is freed
	free(r->buf);
	r->buf = NULL;
	return 0;
}
