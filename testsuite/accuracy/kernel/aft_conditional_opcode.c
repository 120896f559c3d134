// SPDX-License-Identifier: GPL-2.0
/*
 * rbk: the data mover of an invented backup agent ("rbk") that pulls
 * changed blocks from a client and pushes restored blocks back. Small
 * transfers are posted by hand from DMA-mapped pages addressed with the
 * PD's local_dma_lkey; bulk pulls use rdma_rw.
 *
 * rbk does not refuse iWARP devices. rbk_xfer() picks READ or WRITE with a
 * ternary, and on the READ side its sink is local_dma_lkey memory, which can
 * never carry the REMOTE_WRITE an iWARP READ sink needs; rbk_pull_meta()
 * does the same through a helper that fills the SGE. The WRITE-only push and
 * the rdma_rw bulk pull are fine on every transport.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

struct rbk_conn {
	struct ib_qp		*qp;
	struct ib_pd		*pd;
	u32			port_num;
};

struct rbk_op {
	struct rbk_conn		*conn;
	struct ib_rdma_wr	wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	struct rdma_rw_ctx	rw;
	struct scatterlist	*sgl;
	u32			nents;
	u64			dma;
	u32			len;
};

static void rbk_fill_sge(struct rbk_op *op)
{
	op->sge.addr = op->dma;
	op->sge.length = op->len;
	op->sge.lkey = op->conn->pd->local_dma_lkey;
}

int rbk_xfer(struct rbk_op *op, bool pull, u64 raddr, u32 rkey)
{
	rbk_fill_sge(op);
	op->wr.wr.next = NULL;
	op->wr.wr.wr_cqe = &op->cqe;
	op->wr.wr.opcode = pull ? IB_WR_RDMA_READ : IB_WR_RDMA_WRITE;
	op->wr.wr.sg_list = &op->sge;
	op->wr.wr.num_sge = 1;
	op->wr.wr.send_flags = IB_SEND_SIGNALED;
	op->wr.remote_addr = raddr;
	op->wr.rkey = rkey;
	/* BUG: rdma-access-flags-transport -- when pull is set this is a READ whose sink is local_dma_lkey memory; it fails on iWARP */
	return ib_post_send(op->conn->qp, &op->wr.wr, NULL);
}

int rbk_pull_meta(struct rbk_op *op, u64 raddr, u32 rkey)
{
	struct ib_rdma_wr wr = {
		.wr = {
			.opcode = IB_WR_RDMA_READ,
			.wr_cqe = &op->cqe,
			.sg_list = &op->sge,
			.num_sge = 1,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = raddr,
		.rkey = rkey,
	};

	rbk_fill_sge(op);
	/* BUG: rdma-access-flags-transport -- the metadata READ lands in local_dma_lkey memory (filled by rbk_fill_sge()) */
	return ib_post_send(op->conn->qp, &wr.wr, NULL);
}

int rbk_push(struct rbk_op *op, u64 raddr, u32 rkey)
{
	struct ib_rdma_wr wr = {
		.wr = {
			.opcode = IB_WR_RDMA_WRITE,
			.wr_cqe = &op->cqe,
			.sg_list = &op->sge,
			.num_sge = 1,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = raddr,
		.rkey = rkey,
	};

	rbk_fill_sge(op);
	/* OK: rdma-access-flags-transport -- a WRITE source needs no remote rights */
	return ib_post_send(op->conn->qp, &wr.wr, NULL);
}

int rbk_pull_bulk(struct rbk_op *op, u64 raddr, u32 rkey)
{
	int ret;

	/* OK: rdma-access-flags-transport, rdma-local-mr-management -- rdma_rw registers the sink with the rights the transport needs */
	ret = rdma_rw_ctx_init(&op->rw, op->conn->qp, op->conn->port_num,
			       op->sgl, op->nents, 0, raddr, rkey,
			       DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	return rdma_rw_ctx_post(&op->rw, op->conn->qp, op->conn->port_num,
				&op->cqe, NULL);
}
