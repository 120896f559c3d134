// SPDX-License-Identifier: GPL-2.0
/*
 * lsh: the sending side of an invented log shipper that replicates a
 * journal to a standby node. Each record is pushed with one RDMA WRITE WITH
 * IMMEDIATE into the standby's log ring (whose address and rkey came in the
 * handshake); the source is the journal page, DMA-mapped and addressed with
 * the PD's local_dma_lkey. The ring has at most ring_slots records in
 * flight.
 *
 * Bugs: completions are meant to be requested every LSH_SIGNAL_EVERY
 * records, but conn->unsignaled is only ever reset, never advanced, so no
 * WR is ever signaled and the send queue fills after max_send_wr records;
 * and the send queue depth is a fixed 4096 that is never compared with the
 * device's max_qp_wr.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define LSH_SQ_DEPTH		4096
#define LSH_SIGNAL_EVERY	64

struct lsh_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	spinlock_t		lock;
	u32			unsignaled;
	u32			ring_slots;
	u32			head;
	u64			ring_addr;
	u32			ring_rkey;
	u32			slot_size;
	struct ib_cqe		write_cqe;
};

struct lsh_record {
	u64			dma;
	u32			len;
	u32			seq;
};

static void lsh_write_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("lsh: journal write failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

int lsh_create_qp(struct lsh_conn *conn)
{
	struct ib_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.cap.max_send_wr = LSH_SQ_DEPTH; /* BUG: rdma-queue-cap-unchecked -- 4096 send WRs without comparing with attrs.max_qp_wr */
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;

	conn->ring_slots = LSH_SQ_DEPTH - 1;
	conn->write_cqe.done = lsh_write_done;
	spin_lock_init(&conn->lock);
	return rdma_create_qp(conn->cm_id, conn->pd, &attr);
}

int lsh_ship_record(struct lsh_conn *conn, struct lsh_record *rec)
{
	struct ib_rdma_wr wr;
	struct ib_sge sge;
	unsigned long flags;
	int ret;

	sge.addr = rec->dma;
	sge.length = rec->len;
	sge.lkey = conn->pd->local_dma_lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	wr.wr.ex.imm_data = cpu_to_be32(rec->seq);
	wr.wr.sg_list = &sge;
	wr.wr.num_sge = 1;
	wr.wr.wr_cqe = &conn->write_cqe;

	spin_lock_irqsave(&conn->lock, flags);
	wr.remote_addr = conn->ring_addr +
			 (u64)(conn->head % conn->ring_slots) * conn->slot_size;
	wr.rkey = conn->ring_rkey;
	conn->head++;

	/* BUG: rdma-unsignaled-send-starvation -- conn->unsignaled is never advanced, so this branch never runs and nothing reclaims send-queue entries */
	if (conn->unsignaled >= LSH_SIGNAL_EVERY) {
		wr.wr.send_flags = IB_SEND_SIGNALED;
		conn->unsignaled = 0;
	}
	ret = ib_post_send(conn->cm_id->qp, &wr.wr, NULL);
	spin_unlock_irqrestore(&conn->lock, flags);
	return ret;
}

void lsh_disconnect(struct lsh_conn *conn)
{
	rdma_disconnect(conn->cm_id);
	rdma_destroy_qp(conn->cm_id);
}
