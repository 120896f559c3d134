// SPDX-License-Identifier: GPL-2.0
/*
 * msgr: QP setup of an invented kernel messenger ("msgr") with a data QP,
 * which gathers a message from many page fragments, and a control QP, which
 * sends small headers inline.
 *
 * The data QP asks for 16 send SGEs and 256 bytes of inline data, constants
 * tuned on one adapter; nothing compares them with attrs.max_send_sge or
 * reads back the inline size the device granted, so QP creation fails on
 * devices with smaller limits. The control QP asks for 128 inline bytes but
 * reads cap.max_inline_data back after creation and only inlines what was
 * granted; its SGE counts are within what every device supports.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

#define MSGR_DATA_SEND_SGE	16
#define MSGR_DATA_INLINE	256
#define MSGR_CTRL_INLINE	128

struct msgr_conn {
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*data_qp;
	struct ib_qp		*ctrl_qp;
	u32			depth;
	u32			ctrl_inline;
};

int msgr_create_data_qp(struct msgr_conn *c)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.cap.max_send_wr = c->depth;
	attr.cap.max_recv_wr = c->depth;
	attr.cap.max_send_sge = MSGR_DATA_SEND_SGE; /* BUG: rdma-queue-cap-unchecked -- 16 send SGEs, never compared with attrs.max_send_sge */
	attr.cap.max_recv_sge = 2; /* OK: rdma-queue-cap-unchecked -- two receive SGEs are within every device's limits */
	attr.cap.max_inline_data = MSGR_DATA_INLINE; /* BUG: rdma-queue-cap-unchecked -- 256 inline bytes requested, and the granted size is never read back */

	c->data_qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->data_qp))
		return PTR_ERR(c->data_qp);
	return 0;
}

int msgr_create_ctrl_qp(struct msgr_conn *c)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.cap.max_send_wr = 16;
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = MSGR_CTRL_INLINE; /* OK: rdma-queue-cap-unchecked -- the granted inline size is read back below and only that much is inlined */

	c->ctrl_qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->ctrl_qp))
		return PTR_ERR(c->ctrl_qp);
	c->ctrl_inline = attr.cap.max_inline_data;
	return 0;
}

int msgr_send_ctrl(struct msgr_conn *c, void *hdr, u64 hdr_dma, u32 len)
{
	struct ib_send_wr wr = { };
	struct ib_sge sge;

	sge.addr = hdr_dma;
	sge.length = len;
	sge.lkey = c->pd->local_dma_lkey;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IB_SEND_SIGNALED;
	if (len <= c->ctrl_inline) {
		sge.addr = (uintptr_t)hdr;
		wr.send_flags |= IB_SEND_INLINE;
	}
	return ib_post_send(c->ctrl_qp, &wr, NULL);
}

int msgr_send_data(struct msgr_conn *c, struct ib_sge *frags, int nfrags)
{
	struct ib_send_wr wr = { };

	if (nfrags > MSGR_DATA_SEND_SGE)
		return -EMSGSIZE;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = frags;
	wr.num_sge = nfrags;
	wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(c->data_qp, &wr, NULL);
}
