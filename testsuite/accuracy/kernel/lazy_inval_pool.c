// SPDX-License-Identifier: GPL-2.0
/*
 * lzy: two registration paths of an invented RDMA file-cache server
 * ("lzy") that borrowed rdma_rw's lazy invalidation: an MR is put back in
 * the pool as soon as the I/O completes, marked need_inval, and the next
 * user chains a LOCAL_INV in front of its REG_MR.
 *
 * For the local pull path that is fine: the MR is the sink of the server's
 * own RDMA READ, registered with LOCAL_WRITE only (no remote rights; on
 * iWARP the READ_WITH_INV kills it), exactly what rw.c relies on. The
 * export path copies the scheme for buffers it registers with REMOTE_READ
 * and advertises to clients: between the put and the next reuse the client
 * still holds a working key to pages that went back to the page cache.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct lzy_conn {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	u32			port;
};

struct lzy_io {
	struct lzy_conn		*conn;
	struct ib_mr		*mr;
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	read_wr;
	struct ib_sge		sge;
	struct scatterlist	*sgl;
	int			nents;
	enum dma_data_direction	dir;
	__be32			adv_rkey;
	__be64			adv_addr;
};

static struct ib_send_wr *lzy_reg(struct lzy_io *io, int access)
{
	struct ib_mr *mr = io->mr;
	struct ib_send_wr *first = &io->reg_wr.wr;

	if (mr->need_inval) {
		io->inv_wr.opcode = IB_WR_LOCAL_INV;
		io->inv_wr.num_sge = 0;
		io->inv_wr.send_flags = 0;
		io->inv_wr.ex.invalidate_rkey = mr->lkey;
		io->inv_wr.next = &io->reg_wr.wr;
		first = &io->inv_wr;
	}
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->lkey));
	memset(&io->reg_wr, 0, sizeof(io->reg_wr));
	io->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the server */
	io->reg_wr.mr = mr; /* OK: rdma-rkey-reuse -- the key is rotated for every registration */
	io->reg_wr.key = mr->lkey;
	io->reg_wr.access = access;
	mr->need_inval = true;
	return first;
}

static int lzy_get_mr(struct lzy_io *io)
{
	struct lzy_conn *c = io->conn;

	/* BUG: rdma-local-mr-management -- per-I/O MR from the server's own pool */
	io->mr = ib_mr_pool_get(c->qp, &c->qp->rdma_mrs);
	if (!io->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the server maps pages into its MR */
	if (ib_map_mr_sg(io->mr, io->sgl, io->nents, NULL, SZ_4K) != io->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, io->mr);
		io->mr = NULL;
		return -EINVAL;
	}
	return 0;
}

int lzy_pull(struct lzy_io *io, u64 raddr, u32 rkey)
{
	struct ib_send_wr *first;
	int ret = lzy_get_mr(io);

	if (ret)
		return ret;
	first = lzy_reg(io, IB_ACCESS_LOCAL_WRITE);
	io->reg_wr.wr.next = &io->read_wr.wr;
	io->sge.addr = io->mr->iova;
	io->sge.length = io->mr->length;
	io->sge.lkey = io->mr->lkey;
	io->read_wr.wr.opcode = IB_WR_RDMA_READ;
	io->read_wr.wr.sg_list = &io->sge;
	io->read_wr.wr.num_sge = 1;
	io->read_wr.wr.send_flags = IB_SEND_SIGNALED;
	io->read_wr.remote_addr = raddr;
	io->read_wr.rkey = rkey;
	return ib_post_send(io->conn->qp, first, NULL);
}

void lzy_pull_done(struct lzy_io *io)
{
	struct lzy_conn *c = io->conn;

	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, io->mr); /* OK: rdma-invalidation-leak -- a LOCAL_WRITE-only registration gives the peer nothing to use; the lazy LOCAL_INV at reuse is enough */
	io->mr = NULL;
	ib_dma_unmap_sg(c->ibdev, io->sgl, io->nents, DMA_FROM_DEVICE);
}

int lzy_export(struct lzy_io *io)
{
	struct ib_send_wr *first;
	int ret = lzy_get_mr(io);

	if (ret)
		return ret;
	first = lzy_reg(io, IB_ACCESS_REMOTE_READ);
	io->adv_rkey = cpu_to_be32(io->mr->rkey);
	io->adv_addr = cpu_to_be64(io->mr->iova);
	return ib_post_send(io->conn->qp, first, NULL);
}

void lzy_export_done(struct lzy_io *io)
{
	struct lzy_conn *c = io->conn;

	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, io->mr); /* BUG: rdma-invalidation-leak -- an MR the client holds a REMOTE_READ key for returns to the pool valid; it is invalidated only when reused */
	io->mr = NULL;
	ib_dma_unmap_sg(c->ibdev, io->sgl, io->nents, DMA_TO_DEVICE);
}
