// SPDX-License-Identifier: GPL-2.0
/*
 * lyt: the I/O path of an invented parallel-filesystem data-server client
 * ("lyt") that was ported from a userspace prototype: every READ/WRITE
 * allocates a fresh MR with ib_alloc_mr(), registers the pages, posts the
 * request, and deregisters the MR when the reply's completion comes in.
 *
 * ib_alloc_mr() and ib_dereg_mr() are device commands that belong to queue
 * setup (an MR pool, or rdma_rw); here they run once per I/O, on the submit
 * path and in the completion handler. Deregistration does kill the key, so
 * nothing leaks to the server; but the submit path forgets the fresh MR when
 * the page mapping comes out short.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct lyt_conn {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
};

struct lyt_io {
	struct lyt_conn		*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		reply_cqe;
	struct scatterlist	*sgl;
	int			nents;
	bool			is_read;
	__be32			rkey;
	__be64			addr;
	u64			hdr_dma;
};

void lyt_io_done(struct lyt_io *io, int status);

int lyt_submit(struct lyt_io *io)
{
	struct lyt_conn *conn = io->conn;
	struct ib_mr *mr;
	int n, ret;

	/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- an MR is allocated for every I/O on the submit path */
	mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, io->nents);
	if (IS_ERR(mr))
		return PTR_ERR(mr);

	n = ib_dma_map_sg(conn->ibdev, io->sgl, io->nents,
			  io->is_read ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
	if (!n) {
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- per-I/O deregistration on the submit path */
		ib_dereg_mr(mr); /* OK: rdma-mr-leak -- released before the error return */
		return -EIO;
	}
	/* BUG: rdma-local-mr-management -- the client maps pages into its MR */
	if (ib_map_mr_sg(mr, io->sgl, n, NULL, SZ_4K) != n)
		return -EINVAL; /* BUG: rdma-mr-leak -- the new MR (and the DMA mapping) are dropped */

	memset(&io->reg_wr, 0, sizeof(io->reg_wr));
	io->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	io->reg_wr.wr.next = &io->send_wr;
	io->reg_wr.mr = mr; /* OK: rdma-rkey-reuse -- a brand-new MR, registered once and then deregistered */
	io->reg_wr.key = mr->rkey;
	io->reg_wr.access = io->is_read ?
		IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
		IB_ACCESS_REMOTE_READ;
	io->rkey = cpu_to_be32(mr->rkey);
	io->addr = cpu_to_be64(mr->iova);
	io->mr = mr;

	io->send_sge.addr = io->hdr_dma;
	io->send_sge.length = 64;
	io->send_sge.lkey = conn->pd->local_dma_lkey;
	io->send_wr.next = NULL;
	io->send_wr.opcode = IB_WR_SEND;
	io->send_wr.sg_list = &io->send_sge;
	io->send_wr.num_sge = 1;
	io->send_wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(conn->qp, &io->reg_wr.wr, NULL);
	if (ret) {
		io->mr = NULL;
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- per-I/O deregistration on the submit path */
		ib_dereg_mr(mr); /* OK: rdma-mr-leak -- released when the post fails */
	}
	return ret;
}

void lyt_reply_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct lyt_io *io = container_of(wc->wr_cqe, struct lyt_io, reply_cqe);
	struct lyt_conn *conn = io->conn;

	ib_dma_unmap_sg(conn->ibdev, io->sgl, io->nents,
			io->is_read ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
	/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the MR is deregistered in the completion handler, once per I/O */
	ib_dereg_mr(io->mr); /* OK: rdma-invalidation-leak -- deregistration kills the server's key */
	io->mr = NULL;
	lyt_io_done(io, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}
