// SPDX-License-Identifier: GPL-2.0
/*
 * dbl: the producer side of an invented shared-ring channel ("dbl"): data is
 * RDMA-written into the consumer's ring and a small SEND rings the
 * consumer's doorbell. Flow control comes from the consumer's credit
 * messages on the receive queue.
 *
 * The QP is created with IB_SIGNAL_REQ_WR to avoid a completion per WRITE,
 * but no post in this file ever asks for one: neither the WRITEs nor the
 * doorbell SENDs set IB_SEND_SIGNALED. Receive credits do not retire send
 * queue entries, so after max_send_wr posts every ib_post_send() fails with
 * -ENOMEM. The queue size itself (WRITE + SEND per slot, plus one) is fine.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

struct dbl_chan {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	u32			slots;
	u32			credits;
	u64			ring_addr;
	u32			ring_rkey;
	u32			slot_size;
	u32			tail;
};

struct dbl_slot {
	struct ib_rdma_wr	write_wr;
	struct ib_send_wr	bell_wr;
	struct ib_sge		data_sge;
	struct ib_sge		bell_sge;
	__be32			bell;
	u64			bell_dma;
};

int dbl_create_qp(struct dbl_chan *ch)
{
	struct ib_qp_init_attr attr = {
		.send_cq	= ch->cq,
		.recv_cq	= ch->cq,
		.qp_type	= IB_QPT_RC,
		.qp_context	= ch,
	};

	attr.cap.max_send_wr = 2 * ch->slots + 1; /* OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a WRITE and a SEND per slot; no registration is posted */
	attr.cap.max_recv_wr = ch->slots;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* BUG(file): rdma-unsignaled-send-starvation -- only requested WRs complete, and no post here ever requests one */
	return rdma_create_qp(ch->cm_id, ch->pd, &attr);
}

int dbl_produce(struct dbl_chan *ch, struct dbl_slot *s, u64 dma, u32 len)
{
	u32 idx;

	if (!ch->credits)
		return -EAGAIN;
	ch->credits--;
	idx = ch->tail++ % ch->slots;

	s->data_sge.addr = dma;
	s->data_sge.length = len;
	s->data_sge.lkey = ch->pd->local_dma_lkey;
	s->write_wr.wr.opcode = IB_WR_RDMA_WRITE;
	s->write_wr.wr.sg_list = &s->data_sge;
	s->write_wr.wr.num_sge = 1;
	s->write_wr.wr.send_flags = 0;
	s->write_wr.remote_addr = ch->ring_addr + (u64)idx * ch->slot_size;
	s->write_wr.rkey = ch->ring_rkey;
	s->write_wr.wr.next = &s->bell_wr;

	s->bell = cpu_to_be32(idx);
	s->bell_sge.addr = s->bell_dma;
	s->bell_sge.length = sizeof(s->bell);
	s->bell_sge.lkey = ch->pd->local_dma_lkey;
	s->bell_wr.opcode = IB_WR_SEND;
	s->bell_wr.sg_list = &s->bell_sge;
	s->bell_wr.num_sge = 1;
	s->bell_wr.send_flags = IB_SEND_SOLICITED;
	s->bell_wr.next = NULL;

	return ib_post_send(ch->cm_id->qp, &s->write_wr.wr, NULL);
}

void dbl_credit_update(struct dbl_chan *ch, u32 credits)
{
	ch->credits += credits;
}
