/*
 * rahead: the readahead engine of a distributed file-system client, on
 * librdmacm (rdma_create_qp, rdma_reg_msgs, rdma_post_send/recv,
 * rdma_get_recv_comp).  An open file gets a readahead context: a few
 * page-sized buffers, each exposed to the data server through its own
 * type-2 window.  A readahead request binds a window over one buffer
 * (BIND_MW posted on the cm_id's QP) and sends READAHEAD(ino, off, va,
 * rkey); the server RDMA-WRITEs the pages and replies with SEND_WITH_INV
 * on the window's key, after which the buffer may be bound again for the
 * next extent.
 *
 * Correct: windows are allocated in a loop unwound through a goto
 * ladder; the send queue is a fixed depth that covers every window's
 * BIND_MW + READAHEAD SEND + LOCAL_INV (no per-request factor).
 *
 * Not correct: re-binding a buffer for the next extent reuses the
 * window's allocation key (mw->rkey is not updated for type-2 binds), so
 * the server -- or anyone who saw an earlier READAHEAD -- can still write
 * with an old key; the reply handler takes IBV_WC_WITH_INV as "this
 * buffer's window is dead" without comparing the key; closing a file
 * while readahead is in flight frees the buffers with their windows still
 * bound, and frees the context without deallocating the windows.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RA_BUFS		8
#define RA_BUF_SIZE	(128 * 1024)
#define RA_CTXS		64	/* open files with readahead */
#define RA_SQ_DEPTH	1024	/* BIND_MW + READAHEAD for every buffer of every context */

struct ra_req_msg {
	uint64_t ino;
	uint64_t off;
	uint64_t va;
	uint32_t rkey;
	uint32_t len;
	uint32_t buf;
	uint32_t rsvd;
};

struct ra_reply {
	uint32_t buf;
	int32_t  status;
	uint32_t len;
	uint32_t rsvd;
};

struct ra_buf {
	struct ibv_mw *mw;
	char          *pages;
	uint64_t       off;
	int            bound;
	int            valid;
};

struct ra_ctx {
	struct rdma_cm_id *id;
	struct ibv_mr     *pages_mr;	/* LOCAL_WRITE | MW_BIND over all buffers */
	struct ibv_mr     *msg_mr;	/* covers req[] and rep[] */
	char              *pages;
	uint64_t           ino;
	struct ra_buf      buf[RA_BUFS];
	struct ra_req_msg  req[RA_BUFS];
	struct ra_reply    rep[RA_BUFS];
};

/* the CQs are created by rdma_create_qp() (id->send_cq, id->recv_cq) */
int ra_create_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa;

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 0;
	/* OK: rdma-send-queue-manual-factor -- a fixed depth with no per-request factor */
	qa.cap.max_send_wr = RA_SQ_DEPTH;
	qa.cap.max_recv_wr = RA_BUFS * RA_CTXS;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	return rdma_create_qp(id, NULL, &qa);
}

int ra_ctx_init(struct ra_ctx *ra, struct rdma_cm_id *id, uint64_t ino)
{
	int i;

	memset(ra, 0, sizeof(*ra));
	ra->id = id;
	ra->ino = ino;
	ra->pages = aligned_alloc(4096, (size_t)RA_BUFS * RA_BUF_SIZE);
	if (!ra->pages)
		return -ENOMEM;
	ra->pages_mr = ibv_reg_mr(id->pd, ra->pages, (size_t)RA_BUFS * RA_BUF_SIZE,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!ra->pages_mr)
		goto err_pages;
	ra->msg_mr = rdma_reg_msgs(id, ra->req, sizeof(ra->req) + sizeof(ra->rep));
	if (!ra->msg_mr)
		goto err_pages_mr;
	for (i = 0; i < RA_BUFS; i++) {
		ra->buf[i].pages = ra->pages + (size_t)i * RA_BUF_SIZE;
		ra->buf[i].mw = ibv_alloc_mw(id->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- readahead windows managed by the ULP
		if (!ra->buf[i].mw)
			goto err_mw;
		if (rdma_post_recv(id, &ra->rep[i], &ra->rep[i], sizeof(ra->rep[i]), ra->msg_mr))
			goto err_mw_cur;
	}
	return 0;

err_mw_cur:
	ibv_dealloc_mw(ra->buf[i].mw);
err_mw:
	/* OK: rdma-mr-leak -- the windows allocated before the failure are deallocated */
	while (--i >= 0)
		ibv_dealloc_mw(ra->buf[i].mw);
	rdma_dereg_mr(ra->msg_mr);
err_pages_mr:
	ibv_dereg_mr(ra->pages_mr);
err_pages:
	free(ra->pages);
	return -ENOMEM;
}

int ra_issue(struct ra_ctx *ra, int i, uint64_t off)
{
	struct ra_buf *b = &ra->buf[i];
	struct ibv_send_wr bind, *bad;

	memset(&bind, 0, sizeof(bind));
	bind.wr_id = (uintptr_t)b;
	bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-readahead window bind done by the ULP
	bind.bind_mw.mw = b->mw;
	bind.bind_mw.rkey = b->mw->rkey; // BUG: rdma-rkey-reuse -- every readahead re-binds the buffer under the window's allocation key
	bind.bind_mw.bind_info.mr = ra->pages_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)b->pages;
	bind.bind_mw.bind_info.length = RA_BUF_SIZE;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(ra->id->qp, &bind, &bad))
		return -EIO;
	b->bound = 1;
	b->valid = 0;
	b->off = off;

	ra->req[i].ino = htobe64(ra->ino);
	ra->req[i].off = htobe64(off);
	ra->req[i].va = htobe64((uintptr_t)b->pages);
	ra->req[i].rkey = htobe32(b->mw->rkey);
	ra->req[i].len = htobe32(RA_BUF_SIZE);
	ra->req[i].buf = htobe32(i);
	return rdma_post_send(ra->id, &ra->req[i], &ra->req[i], sizeof(ra->req[i]),
			      ra->msg_mr, IBV_SEND_SIGNALED);
}

/* reply for one readahead buffer; returns the buffer index or -1 */
int ra_reply(struct ra_ctx *ra)
{
	struct ibv_wc wc, swc[8];
	struct ra_buf *b;
	uint32_t i;

	/* reap READAHEAD send completions */
	while (ibv_poll_cq(ra->id->send_cq, 8, swc) > 0)
		;
	if (rdma_get_recv_comp(ra->id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS)
		return -1;
	i = be32toh(((struct ra_reply *)(uintptr_t)wc.wr_id)->buf);
	if (i >= RA_BUFS)
		return -1;
	b = &ra->buf[i];
	if (wc.wc_flags & IBV_WC_WITH_INV) { // BUG: rdma-remote-invalidate-unchecked -- whichever key the server invalidated, this buffer is taken as unexposed
		b->bound = 0;
		b->valid = ra->rep[i].status == 0;
	}
	/* else: a failed readahead; the buffer stays bound and unused until close */
	rdma_post_recv(ra->id, &ra->rep[i], &ra->rep[i], sizeof(ra->rep[i]), ra->msg_mr);
	return (int)i;
}

/* the file was closed; ra came from malloc() in ra_open(), its receives were drained */
void ra_ctx_close(struct ra_ctx *ra, int in_flight)
{
	int i;

	if (!in_flight) {
		for (i = 0; i < RA_BUFS; i++)
			ibv_dealloc_mw(ra->buf[i].mw);
		rdma_dereg_mr(ra->msg_mr);
		ibv_dereg_mr(ra->pages_mr);
		free(ra->pages); // OK: rdma-invalidation-leak -- nothing is in flight, windows deallocated and the MR deregistered first
		free(ra);
		return;
	}
	/* readahead in flight: drop everything, the replies will find nothing */
	free(ra->pages); // BUG: rdma-invalidation-leak -- buffers freed while their windows are still bound (keys held by the server)
	free(ra); // BUG: rdma-mr-leak -- the context is freed with its windows and MRs still allocated
}
