// SPDX-License-Identifier: GPL-2.0
/*
 * jrn: the replication path of an invented journaling block device ("jrn")
 * that mirrors every journal record to a peer: the record body goes with an
 * RDMA WRITE into the peer's journal area, and a SEND carrying the record
 * header follows it so the peer knows the body has landed. Only every
 * JRN_SIGNAL_EVERY-th SEND is signaled, using an atomic counter advanced on
 * every post.
 *
 * The bug: the send queue has one entry per outstanding record plus one, but
 * every record occupies two (the WRITE and the SEND) until a later signaled
 * SEND completes, so with depth records in flight the posts overflow the
 * queue. There is no registration in this file; the sizing simply forgot the
 * WRITE.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define JRN_SIGNAL_EVERY	16

struct jrn_mirror {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	u32			depth;
	atomic_t		posted;
	u64			peer_addr;
	u32			peer_rkey;
	struct ib_cqe		cqe;
};

struct jrn_record {
	struct ib_rdma_wr	body_wr;
	struct ib_send_wr	hdr_wr;
	struct ib_sge		body_sge;
	struct ib_sge		hdr_sge;
	u64			body_dma;
	u32			body_len;
	u64			hdr_dma;
	u64			offset;
};

int jrn_create_qp(struct jrn_mirror *m)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = m;
	attr.send_cq = m->cq;
	attr.recv_cq = m->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	/* BUG: rdma-send-queue-undersized -- each record keeps an RDMA WRITE and a SEND on the queue, but only one entry per record is reserved */
	attr.cap.max_send_wr = m->depth + 1; /* OK: rdma-send-queue-manual-factor -- no registration factor (and none posted) */
	attr.cap.max_recv_wr = m->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	atomic_set(&m->posted, 0);
	return rdma_create_qp(m->cm_id, m->pd, &attr);
}

void jrn_destroy_qp(struct jrn_mirror *m)
{
	ib_drain_qp(m->cm_id->qp);
	rdma_destroy_qp(m->cm_id);
}

int jrn_mirror_record(struct jrn_mirror *m, struct jrn_record *r)
{
	r->body_sge.addr = r->body_dma;
	r->body_sge.length = r->body_len;
	r->body_sge.lkey = m->pd->local_dma_lkey;
	r->body_wr.wr.opcode = IB_WR_RDMA_WRITE;
	r->body_wr.wr.sg_list = &r->body_sge;
	r->body_wr.wr.num_sge = 1;
	r->body_wr.wr.send_flags = 0;
	r->body_wr.remote_addr = m->peer_addr + r->offset;
	r->body_wr.rkey = m->peer_rkey;
	r->body_wr.wr.next = &r->hdr_wr;

	r->hdr_sge.addr = r->hdr_dma;
	r->hdr_sge.length = 32;
	r->hdr_sge.lkey = m->pd->local_dma_lkey;
	r->hdr_wr.opcode = IB_WR_SEND;
	r->hdr_wr.sg_list = &r->hdr_sge;
	r->hdr_wr.num_sge = 1;
	r->hdr_wr.next = NULL;
	r->hdr_wr.wr_cqe = &m->cqe;
	r->hdr_wr.send_flags = 0;
	/* OK: rdma-unsignaled-send-starvation -- the counter is advanced on every record, so every 16th SEND is signaled */
	if (atomic_inc_return(&m->posted) % JRN_SIGNAL_EVERY == 0)
		r->hdr_wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(m->cm_id->qp, &r->body_wr.wr, NULL);
}
