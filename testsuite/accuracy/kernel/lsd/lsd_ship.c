// SPDX-License-Identifier: GPL-2.0
/*
 * lsd_ship.c: record shipping (see lsd.h).
 *
 * Each record is an RDMA WRITE of the body into the peer's log followed by
 * an inline SEND of its header. Neither is ever signaled (lsd_conn.c
 * creates the QP with IB_SIGNAL_REQ_WR): the finding belongs to the module
 * as a whole and is annotated there.
 */
#include "lsd.h"

struct lsd_wire_hdr {
	__be64	lsn;
	__be64	offset;
	__be32	len;
	__be32	crc;
};

void lsd_build_hdr(struct lsd_conn *c, struct lsd_rec *r, u64 lsn, u32 crc)
{
	struct lsd_wire_hdr *h = r->hdr;

	h->lsn = cpu_to_be64(lsn);
	h->offset = cpu_to_be64(c->tail);
	h->len = cpu_to_be32(r->body_len);
	h->crc = cpu_to_be32(crc);
	r->hdr_len = sizeof(*h);
}

int lsd_ship(struct lsd_conn *c, struct lsd_rec *r)
{
	r->body_sge.addr = r->body_dma;
	r->body_sge.length = r->body_len;
	r->body_sge.lkey = c->pd->local_dma_lkey;
	r->write_wr.wr.opcode = IB_WR_RDMA_WRITE;
	r->write_wr.wr.sg_list = &r->body_sge;
	r->write_wr.wr.num_sge = 1;
	r->write_wr.wr.send_flags = 0;
	r->write_wr.remote_addr = c->peer_log_addr + c->tail;
	r->write_wr.rkey = c->peer_log_rkey;
	r->write_wr.wr.next = &r->hdr_wr;
	c->tail += r->body_len;

	r->hdr_sge.addr = (uintptr_t)r->hdr;
	r->hdr_sge.length = r->hdr_len;
	r->hdr_sge.lkey = 0;
	r->hdr_wr.next = NULL;
	r->hdr_wr.opcode = IB_WR_SEND;
	r->hdr_wr.sg_list = &r->hdr_sge;
	r->hdr_wr.num_sge = 1;
	r->hdr_wr.send_flags = IB_SEND_INLINE;
	return ib_post_send(c->cm_id->qp, &r->write_wr.wr, NULL);
}

int lsd_ship_batch(struct lsd_conn *c, struct lsd_rec *recs, int n)
{
	int i, ret;

	for (i = 0; i < n; i++) {
		if (!c->credits)
			return i;	/* wait for the standby's acks */
		c->credits--;
		ret = lsd_ship(c, &recs[i]);
		if (ret)
			return ret;
	}
	return n;
}

int lsd_send_barrier(struct lsd_conn *c, void *marker, u32 len)
{
	struct ib_sge sge = {
		.addr = (uintptr_t)marker,
		.length = len,
		.lkey = 0,
	};
	struct ib_send_wr wr = {
		.opcode = IB_WR_SEND,
		.sg_list = &sge,
		.num_sge = 1,
		.send_flags = IB_SEND_INLINE | IB_SEND_SOLICITED,
	};

	if (!c->credits)
		return -EAGAIN;
	c->credits--;
	return ib_post_send(c->cm_id->qp, &wr, NULL);
}
