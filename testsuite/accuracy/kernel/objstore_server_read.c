// SPDX-License-Identifier: GPL-2.0
/*
 * objs: the server side of the invented object store ("objd"). A PUT
 * request names a client buffer (address, rkey, length); the server pulls
 * the payload with its own RDMA READ into a kmalloc'ed staging buffer that
 * is only DMA-mapped and addressed with the PD's local_dma_lkey, then
 * answers with a SEND. A GET pushes the object with an RDMA WRITE from the
 * same kind of staging buffer.
 *
 * The server does not refuse iWARP devices, and on iWARP an RDMA READ sink
 * must be registered with REMOTE_WRITE: local_dma_lkey memory never is, so
 * every PUT fails there (rdma_rw_ctx_init() would register the sink). The
 * WRITE source is fine with local_dma_lkey. The QP asks for 16 send SGEs
 * without looking at what the device supports. Every post is signaled by
 * the QP (IB_SIGNAL_ALL_WR); two WRs per request plus one for the drain
 * fit the send queue, and the factor covers data WRs only.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define OBJS_MAX_SGE	16
#define OBJS_RSP_SIZE	64

struct objs_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	u32			depth;
};

struct objs_op {
	struct objs_conn	*conn;
	struct ib_rdma_wr	rdma_wr;
	struct ib_send_wr	rsp_wr;
	struct ib_sge		data_sge[OBJS_MAX_SGE];
	struct ib_sge		rsp_sge;
	struct ib_cqe		data_cqe;
	struct ib_cqe		rsp_cqe;
	struct scatterlist	*sgl;
	int			nents;
	u64			rsp_dma;
};

int objs_create_qp(struct objs_conn *conn)
{
	struct ib_qp_init_attr attr = {
		.send_cq = conn->cq,
		.recv_cq = conn->cq,
		.qp_type = IB_QPT_RC,
		.qp_context = conn,
	};

	/* one data WR and one response SEND per operation, +1 for drain */
	attr.cap.max_send_wr = 2 * conn->depth + 1; /* OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- READ or WRITE plus the response SEND, and a drain entry; the factor counts data WRs, nothing is registered here */
	attr.cap.max_recv_wr = conn->depth;
	attr.cap.max_send_sge = OBJS_MAX_SGE; /* BUG: rdma-queue-cap-unchecked -- 16 send SGEs requested without comparing with attrs.max_send_sge */
	attr.cap.max_recv_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- sq_sig_type stays IB_SIGNAL_ALL_WR, every WR completes */
	return rdma_create_qp(conn->cm_id, conn->pd, &attr);
}

void objs_destroy_qp(struct objs_conn *conn)
{
	ib_drain_qp(conn->cm_id->qp);
	rdma_destroy_qp(conn->cm_id);
}

static int objs_map_staging(struct objs_op *op, enum dma_data_direction dir)
{
	struct objs_conn *conn = op->conn;
	struct scatterlist *sg;
	int i, count;

	count = ib_dma_map_sg(conn->cm_id->device, op->sgl, op->nents, dir);
	if (count <= 0 || count > OBJS_MAX_SGE)
		return -EIO;
	for_each_sg(op->sgl, sg, count, i) {
		op->data_sge[i].addr = sg_dma_address(sg);
		op->data_sge[i].length = sg_dma_len(sg);
		op->data_sge[i].lkey = conn->pd->local_dma_lkey;
	}
	return count;
}

static void objs_build_rsp(struct objs_op *op)
{
	op->rsp_sge.addr = op->rsp_dma;
	op->rsp_sge.length = OBJS_RSP_SIZE;
	op->rsp_sge.lkey = op->conn->pd->local_dma_lkey;
	op->rsp_wr.next = NULL;
	op->rsp_wr.wr_cqe = &op->rsp_cqe;
	op->rsp_wr.sg_list = &op->rsp_sge;
	op->rsp_wr.num_sge = 1;
	op->rsp_wr.opcode = IB_WR_SEND;
	op->rsp_wr.send_flags = 0;
}

/* called from the READ's completion once the object is stored */
int objs_send_rsp(struct objs_op *op)
{
	objs_build_rsp(op);
	return ib_post_send(op->conn->cm_id->qp, &op->rsp_wr, NULL);
}

int objs_handle_put(struct objs_op *op, u64 raddr, u32 rkey)
{
	int count;

	count = objs_map_staging(op, DMA_FROM_DEVICE);
	if (count < 0)
		return count;

	op->rdma_wr.wr.next = NULL;
	op->rdma_wr.wr.wr_cqe = &op->data_cqe;
	op->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	op->rdma_wr.wr.sg_list = op->data_sge;
	op->rdma_wr.wr.num_sge = count;
	op->rdma_wr.wr.send_flags = 0;
	op->rdma_wr.remote_addr = raddr;
	op->rdma_wr.rkey = rkey;

	/* BUG: rdma-access-flags-transport -- the READ sink is addressed with local_dma_lkey, which has no REMOTE_WRITE; on iWARP the READ fails */
	return ib_post_send(op->conn->cm_id->qp, &op->rdma_wr.wr, NULL);
}

int objs_handle_get(struct objs_op *op, u64 raddr, u32 rkey)
{
	int count;

	count = objs_map_staging(op, DMA_TO_DEVICE);
	if (count < 0)
		return count;

	op->rdma_wr.wr.wr_cqe = &op->data_cqe;
	op->rdma_wr.wr.opcode = IB_WR_RDMA_WRITE;
	op->rdma_wr.wr.sg_list = op->data_sge;
	op->rdma_wr.wr.num_sge = count;
	op->rdma_wr.wr.send_flags = 0;
	op->rdma_wr.remote_addr = raddr;
	op->rdma_wr.rkey = rkey;
	objs_build_rsp(op);
	op->rdma_wr.wr.next = &op->rsp_wr;

	/* OK: rdma-access-flags-transport -- an RDMA WRITE source needs no remote rights on any transport */
	return ib_post_send(op->conn->cm_id->qp, &op->rdma_wr.wr, NULL);
}
