/*
 * dsm-pager: the remote-paging client of a disaggregated-memory runtime.
 * A page-out exposes the page through a type-2 window (BIND_MW chained to
 * the PAGE_OUT request); the memory server RDMA-READs the page and replies.
 * A reply with SEND_WITH_INV on the page's key kills the window (checked);
 * otherwise the client posts a signaled LOCAL_INV and returns the frame to
 * the free-frame list from that completion.
 *
 * Not correct: when the PAGE_OUT send itself completes in error (flushed
 * because the connection dropped), the handler returns the frame to the
 * free list right away; the window bound in front of it may have been
 * executed, and no LOCAL_INV runs on that path.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum pg_wr { PG_WR_SEND = 1, PG_WR_INV = 2 };

struct pg_frame {
	struct pg_frame   *next;
	void              *page;
	struct ibv_mw     *mw;
	uint32_t           key;
	struct ibv_send_wr bind, send, inv;
	struct ibv_sge     sge;
	uint64_t           hdr[4];
};

struct pager {
	struct ibv_pd   *pd;
	struct ibv_qp   *qp;
	struct ibv_mr   *frames_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr   *hdr_mr;
	struct pg_frame *free_frames;
};

#define PG_WRID(f, kind)	((uintptr_t)(f) | (kind))
#define PG_FRAME(wr_id)		((struct pg_frame *)(uintptr_t)((wr_id) & ~3ull))

static void pg_frame_put(struct pager *p, struct pg_frame *f)
{
	f->next = p->free_frames;
	p->free_frames = f;
}

int pg_page_out(struct pager *p, struct pg_frame *f, uint64_t pfn)
{
	struct ibv_send_wr *bad;

	f->key = ibv_inc_rkey(f->key);
	memset(&f->bind, 0, sizeof(f->bind));
	f->bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-page window bind done by the ULP
	f->bind.bind_mw.mw = f->mw;
	f->bind.bind_mw.rkey = f->key;
	f->bind.bind_mw.bind_info.mr = p->frames_mr;
	f->bind.bind_mw.bind_info.addr = (uintptr_t)f->page;
	f->bind.bind_mw.bind_info.length = 4096;
	f->bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	f->bind.next = &f->send;

	f->hdr[0] = pfn;
	f->hdr[1] = (uintptr_t)f->page;
	f->hdr[2] = f->key;
	f->sge.addr = (uintptr_t)f->hdr;
	f->sge.length = sizeof(f->hdr);
	f->sge.lkey = p->hdr_mr->lkey;
	memset(&f->send, 0, sizeof(f->send));
	f->send.wr_id = PG_WRID(f, PG_WR_SEND);
	f->send.opcode = IBV_WR_SEND;
	f->send.sg_list = &f->sge;
	f->send.num_sge = 1;
	f->send.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(p->qp, &f->bind, &bad);
}

static int pg_local_inv(struct pager *p, struct pg_frame *f)
{
	struct ibv_send_wr *bad;

	memset(&f->inv, 0, sizeof(f->inv));
	f->inv.wr_id = PG_WRID(f, PG_WR_INV);
	f->inv.opcode = IBV_WR_LOCAL_INV;
	f->inv.invalidate_rkey = f->key;
	f->inv.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(p->qp, &f->inv, &bad);
}

void pg_send_wc(struct pager *p, struct ibv_wc *wc)
{
	struct pg_frame *f = PG_FRAME(wc->wr_id);

	if ((wc->wr_id & 3) == PG_WR_INV) {
		if (wc->status == IBV_WC_SUCCESS)
			pg_frame_put(p, f);	/* OK: rdma-invalidation-leak -- the LOCAL_INV completed */
		return;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		// BUG: rdma-invalidation-leak -- on a failed PAGE_OUT the frame is recycled without invalidating its window
		pg_frame_put(p, f);
		return;
	}
	/* success: the frame waits for the server's reply */
}

void pg_reply(struct pager *p, struct pg_frame *f, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated key must be this frame's */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == f->key) {
		pg_frame_put(p, f);
		return;
	}
	if (pg_local_inv(p, f))
		return;		/* frame stays out; reclaimed when the QP is torn down */
}
