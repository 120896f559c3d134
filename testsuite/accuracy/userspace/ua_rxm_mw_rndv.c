/*
 * ua_rxm_mw_rndv.c - rxm-style rendezvous over extended verbs with type-2
 * memory windows.
 *
 * Large tagged messages do not copy.  READ protocol: the sender binds a
 * type-2 window of its tx buffer over the user payload (REMOTE_READ, key
 * rotated with ibv_inc_rkey()), sends an RTS carrying the window's rkey, the
 * receiver READs into a bounce slot and acknowledges with SEND_WITH_INV of
 * that rkey.  WRITE protocol (receiver-driven): the receiver binds a window
 * over a slice of its receive arena (REMOTE_WRITE), returns a CTS, and the
 * sender WRITEs and finishes with SEND_WITH_INV.  Every post goes through
 * ibv_wr_start()/ibv_wr_complete() on one RC ibv_qp_ex; one CQ, wr_id
 * carries the buffer pointer and an op tag in the low bits.
 *
 * Correct: key rotation and the checked remote invalidation on the READ
 * protocol's ACK, LOCAL_INV with release from its completion, rx pool unwind.
 * Not correct: the retry path and the CTS bind reuse keys, the arena MR lacks
 * LOCAL_WRITE for a REMOTE_WRITE window, the READ bounce lacks REMOTE_WRITE,
 * a NACKed send recycles a bound window, cancel recycles right after an
 * unsignaled LOCAL_INV, WDONE trusts any invalidation, the tx pool unwind
 * skips element 0, and the SQ has 2 slots per message for 3 WRs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <infiniband/verbs.h>

#define RXM_TX_SIZE		128
#define RXM_RX_SIZE		128
#define RXM_BOUNCE_SLOT		(64 * 1024)
#define RXM_ARENA_SIZE		(64UL << 20)
#define RXM_ARENA_SLOT		(RXM_ARENA_SIZE / RXM_RX_SIZE)

#define RXM_WRID(ptr, op)	((uint64_t)(uintptr_t)(ptr) | (op))
#define RXM_WRID_OP(id)		((int)((id) & 7))
#define RXM_WRID_PTR(id)	((void *)(uintptr_t)((id) & ~7ULL))

enum rxm_op { RXM_OP_RECV = 1, RXM_OP_RTS, RXM_OP_INV, RXM_OP_READ, RXM_OP_SEND, RXM_OP_WDONE };
enum rxm_pkt_type { RXM_PKT_RTS = 1, RXM_PKT_ACK, RXM_PKT_RTW, RXM_PKT_CTS, RXM_PKT_WDONE };

struct rxm_pkt {
	uint8_t		type;
	uint8_t		status;		/* ACK: 0 or a positive errno */
	uint16_t	idx;		/* sender's tx or rx buffer index */
	uint32_t	rkey;
	uint64_t	addr;
	uint64_t	len;
	uint64_t	tag;
} __attribute__((aligned(8)));

struct rxm_tx_buf {
	struct rxm_tx_buf	*next;		/* ep->tx_free */
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key of the current binding */
	void			*buf;
	size_t			len;
	uint64_t		tag;
	struct rxm_pkt		pkt;
} __attribute__((aligned(8)));

struct rxm_rx_buf {
	struct ibv_mw		*mw;		/* WRITE-protocol sink window */
	int			busy;
	uint16_t		peer_idx;
	uint32_t		peer_rkey;
	struct rxm_pkt		pkt;
} __attribute__((aligned(8)));

struct rxm_ep {
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	unsigned		tx_size;
	struct ibv_mr		*data_mr;	/* sender payloads, windows bound over it */
	void			*arena;
	struct ibv_mr		*arena_mr;	/* receive arena, windows bound over it */
	void			*bounce;
	struct ibv_mr		*bounce_mr;	/* READ-protocol sink */
	struct rxm_pkt		*ctrl;
	struct ibv_mr		*ctrl_mr;	/* receive ring */
	struct rxm_tx_buf	tx_bufs[RXM_TX_SIZE];
	struct rxm_tx_buf	*tx_free;
	struct rxm_rx_buf	rx_bufs[RXM_RX_SIZE];
	void			(*send_done)(void *buf, uint64_t tag, int status);
};

static struct rxm_tx_buf *rxm_tx_get(struct rxm_ep *ep)
{
	struct rxm_tx_buf *tx = ep->tx_free;

	if (tx)
		ep->tx_free = tx->next;
	return tx;
}

static void rxm_tx_release(struct rxm_ep *ep, struct rxm_tx_buf *tx, int status)
{
	tx->next = ep->tx_free;
	ep->tx_free = tx;
	ep->send_done(tx->buf, tx->tag, status);
}

/* sender: expose the payload through a fresh binding and send the RTS */
int rxm_send_rndv(struct rxm_ep *ep, void *buf, size_t len, uint64_t tag)
{
	struct ibv_mw_bind_info bind = {
		.mr = ep->data_mr, .addr = (uintptr_t)buf, .length = len,
		.mw_access_flags = IBV_ACCESS_REMOTE_READ,
	};
	struct rxm_tx_buf *tx;

	tx = rxm_tx_get(ep);
	if (!tx)
		return -EAGAIN;
	tx->buf = buf;
	tx->len = len;
	tx->tag = tag;
	tx->rkey = ibv_inc_rkey(tx->mw->rkey);

	tx->pkt = (struct rxm_pkt){ .type = RXM_PKT_RTS, .idx = tx - ep->tx_bufs,
				    .rkey = tx->rkey, .addr = (uintptr_t)buf,
				    .len = len, .tag = tag };
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(tx, RXM_OP_RTS);
	ep->qpx->wr_flags = 0;
	/* OK: rdma-rkey-reuse, rdma-access-flags-invalid -- key rotated with ibv_inc_rkey() above; REMOTE_READ window over data_mr (LOCAL_WRITE | MW_BIND) */
	ibv_wr_bind_mw(ep->qpx, tx->mw, tx->rkey, &bind); /* BUG: rdma-local-mr-management -- window bound to hand the peer a key to the payload */
	ep->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ep->qpx);
	ibv_wr_set_inline_data(ep->qpx, &tx->pkt, sizeof(tx->pkt));
	if (ibv_wr_complete(ep->qpx)) {
		/* OK: rdma-invalidation-leak -- nothing was posted, the window was never bound */
		rxm_tx_release(ep, tx, -EIO);
		return -EIO;
	}
	return 0;
}

/* sender: the receiver answered EAGAIN (no rx slot); drop the binding, re-expose and resend */
int rxm_rndv_retry(struct rxm_ep *ep, struct rxm_tx_buf *tx)
{
	struct ibv_mw_bind_info bind = {
		.mr = ep->data_mr, .addr = (uintptr_t)tx->buf, .length = tx->len,
		.mw_access_flags = IBV_ACCESS_REMOTE_READ,
	};

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(tx, RXM_OP_SEND);
	ep->qpx->wr_flags = 0;
	ibv_wr_local_inv(ep->qpx, tx->rkey);
	/* same key: tx->pkt, which is resent as is, already carries it */
	ibv_wr_bind_mw(ep->qpx, tx->mw, tx->rkey, &bind); /* BUG: rdma-rkey-reuse, rdma-local-mr-management -- rebinds under the key the peer already has; not rotated with ibv_inc_rkey() */
	ep->qpx->wr_id = RXM_WRID(tx, RXM_OP_RTS);
	ep->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ep->qpx);
	ibv_wr_set_inline_data(ep->qpx, &tx->pkt, sizeof(tx->pkt));
	return ibv_wr_complete(ep->qpx);
}

static int rxm_tx_local_inv(struct rxm_ep *ep, struct rxm_tx_buf *tx, int signaled)
{
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(tx, RXM_OP_INV);
	ep->qpx->wr_flags = signaled ? IBV_SEND_SIGNALED : 0;
	ibv_wr_local_inv(ep->qpx, tx->rkey);
	return ibv_wr_complete(ep->qpx);
}

/* application cancels a pending send */
int rxm_tx_cancel(struct rxm_ep *ep, struct rxm_tx_buf *tx)
{
	int ret;

	ret = rxm_tx_local_inv(ep, tx, 0);
	if (ret)
		return ret;
	/* OK: rdma-invalidation-leak -- the LOCAL_INV of the window was posted just above */
	rxm_tx_release(ep, tx, -ECANCELED); /* BUG: rdma-unmap-before-invalidate -- buffer and tx entry handed back right after an unsignaled LOCAL_INV */
	return 0;
}

/* sender: ACK for the READ protocol arrives as SEND_WITH_INV of our window key */
static void rxm_handle_ack(struct rxm_ep *ep, struct ibv_wc *wc, struct rxm_pkt *pkt)
{
	struct rxm_tx_buf *tx = &ep->tx_bufs[pkt->idx % RXM_TX_SIZE];

	if (pkt->status) {
		/* receiver refused the message (no match / truncated): fail the send */
		rxm_tx_release(ep, tx, -pkt->status); /* BUG: rdma-invalidation-leak -- the plain-SEND NACK invalidated nothing; the window is still bound when the tx buffer is recycled */
		return;
	}
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == tx->rkey) { /* OK: rdma-remote-invalidate-unchecked -- invalidated_rkey is compared with the window's key */
		rxm_tx_release(ep, tx, 0); /* OK: rdma-invalidation-leak -- the peer invalidated exactly this key */
		return;
	}
	if (rxm_tx_local_inv(ep, tx, 1))
		fprintf(stderr, "rxm: LOCAL_INV of 0x%x failed, window stays bound\n", tx->rkey);
	/* released from the LOCAL_INV completion */
}

/* receiver, READ protocol: pull the payload into a bounce slot */
static int rxm_handle_rts(struct rxm_ep *ep, struct rxm_pkt *pkt)
{
	struct rxm_rx_buf *rx = NULL;
	char *slot;
	int i;

	for (i = 0; i < RXM_RX_SIZE; i++) {
		if (!ep->rx_bufs[i].busy) {
			rx = &ep->rx_bufs[i];
			break;
		}
	}
	if (!rx || pkt->len > RXM_BOUNCE_SLOT)
		return -EAGAIN;
	rx->busy = 1;
	rx->peer_idx = pkt->idx;
	rx->peer_rkey = pkt->rkey;
	slot = (char *)ep->bounce + (size_t)i * RXM_BOUNCE_SLOT;

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(rx, RXM_OP_READ);
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(ep->qpx, pkt->rkey, pkt->addr);
	ibv_wr_set_sge(ep->qpx, ep->bounce_mr->lkey, (uintptr_t)slot, pkt->len); /* BUG: rdma-access-flags-transport -- READ sink bounce_mr has no REMOTE_WRITE; iWARP rejects the READ response */
	return ibv_wr_complete(ep->qpx);
}

/* receiver: READ done, acknowledge and invalidate the sender's window */
static int rxm_read_done(struct rxm_ep *ep, struct rxm_rx_buf *rx)
{
	rx->pkt = (struct rxm_pkt){ .type = RXM_PKT_ACK, .idx = rx->peer_idx };
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(rx, RXM_OP_SEND);
	ep->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send_inv(ep->qpx, rx->peer_rkey);
	ibv_wr_set_inline_data(ep->qpx, &rx->pkt, sizeof(rx->pkt));
	rx->busy = 0;
	return ibv_wr_complete(ep->qpx);
}

/* receiver, WRITE protocol: expose an arena slice and answer with a CTS */
static int rxm_handle_rtw(struct rxm_ep *ep, struct rxm_pkt *pkt)
{
	struct ibv_mw_bind_info bind;
	struct rxm_rx_buf *rx = NULL;
	int i;

	for (i = 0; i < RXM_RX_SIZE && !rx; i++)
		if (!ep->rx_bufs[i].busy)
			rx = &ep->rx_bufs[i];
	if (!rx || pkt->len > RXM_ARENA_SLOT)
		return -EAGAIN;
	rx->busy = 1;

	bind.mr = ep->arena_mr;
	bind.addr = (uintptr_t)ep->arena + (size_t)(rx - ep->rx_bufs) * RXM_ARENA_SLOT;
	bind.length = pkt->len;
	bind.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	rx->pkt = (struct rxm_pkt){ .type = RXM_PKT_CTS, .idx = rx - ep->rx_bufs,
				    .addr = bind.addr, .len = pkt->len, .tag = pkt->tag };

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(rx, RXM_OP_SEND);
	ep->qpx->wr_flags = 0;
	/* BUG: rdma-local-mr-management -- window bound to give the peer a write key */
	ibv_wr_bind_mw(ep->qpx, rx->mw, rx->mw->rkey, &bind); /* BUG: rdma-access-flags-invalid, rdma-rkey-reuse -- arena_mr has no LOCAL_WRITE for a REMOTE_WRITE window; the pooled window is rebound under its previous key */
	rx->pkt.rkey = rx->mw->rkey;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ep->qpx);
	ibv_wr_set_inline_data(ep->qpx, &rx->pkt, sizeof(rx->pkt));
	return ibv_wr_complete(ep->qpx);
}

/* sender, WRITE protocol (RTW sent by the eager path with tag = tx index):
 * the receiver exposed a slice; write it and invalidate its window */
static int rxm_handle_cts(struct rxm_ep *ep, struct rxm_pkt *pkt)
{
	struct rxm_tx_buf *tx = &ep->tx_bufs[pkt->tag % RXM_TX_SIZE];

	tx->pkt = (struct rxm_pkt){ .type = RXM_PKT_WDONE, .idx = pkt->idx, .tag = tx->tag };
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = RXM_WRID(tx, RXM_OP_WDONE);
	ep->qpx->wr_flags = 0;
	ibv_wr_rdma_write(ep->qpx, pkt->rkey, pkt->addr);
	ibv_wr_set_sge(ep->qpx, ep->data_mr->lkey, (uintptr_t)tx->buf, tx->len);
	ep->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send_inv(ep->qpx, pkt->rkey);
	ibv_wr_set_inline_data(ep->qpx, &tx->pkt, sizeof(tx->pkt));
	return ibv_wr_complete(ep->qpx);
}

/* receiver: the sender finished writing and invalidated the slice's window */
static void rxm_handle_wdone(struct rxm_ep *ep, struct ibv_wc *wc, struct rxm_pkt *pkt)
{
	struct rxm_rx_buf *rx = &ep->rx_bufs[pkt->idx % RXM_RX_SIZE];

	if (!(wc->wc_flags & IBV_WC_WITH_INV)) {
		/* old senders use a plain SEND: invalidate here, free the slot on completion */
		ibv_wr_start(ep->qpx);
		ep->qpx->wr_id = RXM_WRID(rx, RXM_OP_INV);
		ep->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(ep->qpx, rx->mw->rkey);
		ibv_wr_complete(ep->qpx);
	} else {
		rx->busy = 0; /* BUG: rdma-remote-invalidate-unchecked -- any invalidated rkey is taken as this slice's window */
	}
}

int rxm_ep_progress(struct rxm_ep *ep)
{
	struct ibv_wc wc[8];
	struct rxm_pkt *pkt;
	int i, n;

	n = ibv_poll_cq(ep->cq, 8, wc);
	for (i = 0; i < n; i++) {
		void *ctx = RXM_WRID_PTR(wc[i].wr_id);

		switch (RXM_WRID_OP(wc[i].wr_id)) {
		case RXM_OP_RECV:
			pkt = ctx;
			if (pkt->type == RXM_PKT_RTS)
				rxm_handle_rts(ep, pkt);
			else if (pkt->type == RXM_PKT_ACK)
				rxm_handle_ack(ep, &wc[i], pkt);
			else if (pkt->type == RXM_PKT_RTW)
				rxm_handle_rtw(ep, pkt);
			else if (pkt->type == RXM_PKT_CTS)
				rxm_handle_cts(ep, pkt);
			else if (pkt->type == RXM_PKT_WDONE)
				rxm_handle_wdone(ep, &wc[i], pkt);
			break;
		case RXM_OP_RTS:
			if (wc[i].status != IBV_WC_SUCCESS)
				fprintf(stderr, "rxm: RTS failed: %s\n", ibv_wc_status_str(wc[i].status));
			break;
		case RXM_OP_INV:
			if (ctx >= (void *)ep->tx_bufs && ctx < (void *)(ep->tx_bufs + RXM_TX_SIZE))
				rxm_tx_release(ep, ctx, 0); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the LOCAL_INV's own completion */
			else
				((struct rxm_rx_buf *)ctx)->busy = 0;
			break;
		case RXM_OP_READ:
			rxm_read_done(ep, ctx);
			break;
		case RXM_OP_WDONE:	/* WRITE protocol: no window of ours was bound */
			rxm_tx_release(ep, ctx, wc[i].status == IBV_WC_SUCCESS ? 0 : -EIO);
			break;
		default:
			break;
		}
	}
	return n;
}

int rxm_ep_init(struct rxm_ep *ep, struct ibv_context *ctx, void *data, size_t data_len)
{
	struct ibv_qp_init_attr_ex attr;
	int i;

	memset(ep, 0, sizeof(*ep));
	ep->tx_size = RXM_TX_SIZE;
	ep->pd = ibv_alloc_pd(ctx);
	ep->cq = ibv_create_cq(ctx, 2 * RXM_TX_SIZE + RXM_RX_SIZE, NULL, NULL, 0);
	if (!ep->pd || !ep->cq)
		return -ENOMEM;

	ep->data_mr = ibv_reg_mr(ep->pd, data, data_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	ep->arena = aligned_alloc(4096, RXM_ARENA_SIZE);
	ep->arena_mr = ibv_reg_mr(ep->pd, ep->arena, RXM_ARENA_SIZE, IBV_ACCESS_MW_BIND);
	ep->bounce = aligned_alloc(4096, (size_t)RXM_RX_SIZE * RXM_BOUNCE_SLOT);
	ep->bounce_mr = ibv_reg_mr(ep->pd, ep->bounce, (size_t)RXM_RX_SIZE * RXM_BOUNCE_SLOT, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- local sink of the endpoint's own RDMA READ */
	ep->ctrl = calloc(RXM_RX_SIZE, sizeof(*ep->ctrl));
	ep->ctrl_mr = ibv_reg_mr(ep->pd, ep->ctrl, RXM_RX_SIZE * sizeof(*ep->ctrl), IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- receive ring, registered once for local access */
	if (!ep->data_mr || !ep->arena_mr || !ep->bounce_mr || !ep->ctrl_mr)
		goto err_mr;

	for (i = 0; i < RXM_TX_SIZE; i++) {
		ep->tx_bufs[i].mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2); /* BUG: rdma-local-mr-management -- per-message windows managed by the ULP */
		if (!ep->tx_bufs[i].mw)
			goto err_tx;
		ep->tx_bufs[i].next = ep->tx_free;
		ep->tx_free = &ep->tx_bufs[i];
	}
	for (i = 0; i < RXM_RX_SIZE; i++) {
		ep->rx_bufs[i].mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2); /* BUG: rdma-local-mr-management -- per-message windows managed by the ULP */
		if (!ep->rx_bufs[i].mw)
			goto err_rx;
	}

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.pd = ep->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
			      IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_RDMA_WRITE |
			      IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	attr.cap.max_send_wr = 2 * ep->tx_size + 1; /* BUG(file): rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a message costs BIND + RTS + LOCAL_INV (3 WRs, 3 on the retry chain alone) but 2 per tx buffer are reserved, by a hand-made factor */
	attr.cap.max_recv_wr = RXM_RX_SIZE;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct rxm_pkt);
	ep->qp = ibv_create_qp_ex(ctx, &attr);
	if (!ep->qp)
		goto err_rx_all;
	ep->qpx = ibv_qp_to_qp_ex(ep->qp);
	return 0;

err_rx_all:
	i = RXM_RX_SIZE;
err_rx:
	while (i--)
		ibv_dealloc_mw(ep->rx_bufs[i].mw); /* OK: rdma-mr-leak -- while (i--) releases every window allocated so far */
	i = RXM_TX_SIZE;
err_tx:
	while (--i > 0)
		ibv_dealloc_mw(ep->tx_bufs[i].mw); /* BUG: rdma-mr-leak -- --i > 0 stops before tx_bufs[0]; its window leaks */
err_mr:
	if (ep->ctrl_mr)
		ibv_dereg_mr(ep->ctrl_mr);
	if (ep->bounce_mr)
		ibv_dereg_mr(ep->bounce_mr);
	if (ep->arena_mr)
		ibv_dereg_mr(ep->arena_mr);
	if (ep->data_mr)
		ibv_dereg_mr(ep->data_mr);
	free(ep->ctrl);
	free(ep->bounce);
	free(ep->arena);
	return -ENOMEM;
}
