/*
 * dfsc: client of a distributed file service.  A READ call binds a type-2
 * window over the destination (BIND_MW chained to the call SEND); the
 * server RDMA-WRITEs the file data and replies with SEND_WITH_INV.  When
 * the reply carries no invalidation, the client posts a LOCAL_INV.
 *
 * Not correct:
 *  - the completion switch treats any IBV_WC_WITH_INV on a reply as the
 *    death of this call's window without comparing wc->invalidated_rkey;
 *  - the send queue has a fixed 256 entries for up to 128 calls in flight,
 *    each of which can post BIND_MW + SEND + LOCAL_INV.
 * Correct: window keys are rotated with ibv_inc_rkey(); the 256 is within
 * every device's limit; there is no per-request factor in the sizing.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define DFSC_CALLS	128
#define DFSC_SQ		256

struct dfsc_call {
	uint32_t           xid;
	struct ibv_mw     *mw;
	uint32_t           key;
	bool               window_live;
	struct ibv_send_wr bind, send, inv;
	struct ibv_sge     sge;
	char               msg[256];
	void             (*done)(struct dfsc_call *, int);
};

struct dfsc {
	struct ibv_pd    *pd;
	struct ibv_cq    *cq;
	struct ibv_qp    *qp;
	struct ibv_mr    *data_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr    *msg_mr;
	struct dfsc_call  calls[DFSC_CALLS];
};

int dfsc_create_qp(struct dfsc *d)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = d->cq;
	attr.recv_cq = d->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-queue-cap-unchecked, rdma-send-queue-manual-factor -- 256 entries, no per-request factor */
	// BUG(file): rdma-send-queue-undersized -- 128 calls x (BIND_MW + SEND + LOCAL_INV) need 384 entries
	attr.cap.max_send_wr = DFSC_SQ;
	attr.cap.max_recv_wr = DFSC_CALLS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	d->qp = ibv_create_qp(d->pd, &attr);
	return d->qp ? 0 : -errno;
}

int dfsc_read(struct dfsc *d, struct dfsc_call *c, void *dst, uint32_t len, uint32_t msg_len)
{
	struct ibv_send_wr *bad;

	c->key = ibv_inc_rkey(c->key);
	memset(&c->bind, 0, sizeof(c->bind));
	c->bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-call window bind done by the ULP
	c->bind.bind_mw.mw = c->mw;
	c->bind.bind_mw.rkey = c->key; /* OK: rdma-rkey-reuse -- rotated just above */
	c->bind.bind_mw.bind_info.mr = d->data_mr;
	c->bind.bind_mw.bind_info.addr = (uintptr_t)dst;
	c->bind.bind_mw.bind_info.length = len;
	c->bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	c->bind.next = &c->send;
	c->sge = (struct ibv_sge){ (uintptr_t)c->msg, msg_len, d->msg_mr->lkey };
	memset(&c->send, 0, sizeof(c->send));
	c->send.wr_id = (uintptr_t)c;
	c->send.opcode = IBV_WR_SEND;
	c->send.sg_list = &c->sge;
	c->send.num_sge = 1;
	c->send.send_flags = IBV_SEND_SIGNALED;
	c->window_live = true;
	return ibv_post_send(d->qp, &c->bind, &bad) ? -EIO : 0;
}

static void dfsc_local_inv(struct dfsc *d, struct dfsc_call *c)
{
	struct ibv_send_wr *bad;

	memset(&c->inv, 0, sizeof(c->inv));
	c->inv.wr_id = (uintptr_t)c | 1;
	c->inv.opcode = IBV_WR_LOCAL_INV;
	c->inv.invalidate_rkey = c->key;
	c->inv.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(d->qp, &c->inv, &bad))
		c->done(c, -EIO);
}

void dfsc_handle_wc(struct dfsc *d, struct ibv_wc *wc, const uint32_t *rx_xid)
{
	struct dfsc_call *c;

	switch (wc->opcode) {
	case IBV_WC_RECV:
		c = &d->calls[be32toh(rx_xid[wc->wr_id]) % DFSC_CALLS];
		// BUG: rdma-remote-invalidate-unchecked -- any remote invalidation is taken as this call's, invalidated_rkey never compared
		if (wc->wc_flags & IBV_WC_WITH_INV) {
			c->window_live = false;
			c->done(c, 0);
			break;
		}
		dfsc_local_inv(d, c);
		break;
	case IBV_WC_LOCAL_INV:
		c = (struct dfsc_call *)(uintptr_t)(wc->wr_id & ~1ull);
		c->window_live = false;
		c->done(c, wc->status == IBV_WC_SUCCESS ? 0 : -EIO);
		break;
	default:
		break;
	}
}
