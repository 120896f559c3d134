// SPDX-License-Identifier: GPL-2.0
/*
 * fsx: the data-movement helpers of an invented file-server export ("fsx")
 * that pulls client data with RDMA READs into its own fast-registered sink
 * buffers and pushes replies with RDMA WRITEs.
 *
 * On iWARP an RDMA READ sink needs REMOTE_WRITE; fsx knows it, and repeats
 * the rule inline in two places: an "if (rdma_protocol_iwarp())" that adds
 * the flag, and a ternary on rdma_cap_read_inv(). Both are the inline
 * transport test rdma-access-flags-transport reports: rdma_rw_ctx_init()
 * makes this choice in the core. The same transport test is also used to pick
 * READ_WITH_INV as the READ opcode and to size the queue, which is not an
 * access-flag decision. The flags themselves are valid.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct fsx_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	u32			port_num;
	u32			depth;
};

struct fsx_xfer {
	struct fsx_conn		*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	rdma_wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	struct scatterlist	*sgl;
	int			nents;
};

int fsx_send_queue_depth(struct fsx_conn *conn)
{
	int per_io = 2;		/* REG_MR + READ */

	/* OK: rdma-access-flags-transport -- a transport test that sizes the queue, not access flags */
	if (!rdma_cap_read_inv(conn->ibdev, conn->port_num))
		per_io++;	/* a separate LOCAL_INV */
	return per_io * conn->depth;
}

static int fsx_reg_sink(struct fsx_xfer *x)
{
	struct fsx_conn *conn = x->conn;
	int n;

	/* BUG: rdma-local-mr-management -- the server maps the sink into its MR */
	n = ib_map_mr_sg(x->mr, x->sgl, x->nents, NULL, SZ_4K);
	if (n != x->nents)
		return -EINVAL;

	ib_update_fast_reg_key(x->mr, ib_inc_rkey(x->mr->rkey));
	x->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the server */
	x->reg_wr.wr.send_flags = 0;
	x->reg_wr.mr = x->mr; /* OK: rdma-rkey-reuse -- rotated before each registration */
	x->reg_wr.key = x->mr->rkey;
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	if (rdma_protocol_iwarp(conn->ibdev, conn->port_num))
		/* BUG: rdma-access-flags-transport -- the READ sink's rights are chosen by an inline iWARP test */
		x->reg_wr.access |= IB_ACCESS_REMOTE_WRITE; /* OK: rdma-remote-access-overbroad -- on iWARP the READ request hands the sink's STag to the peer, which needs the right to place the response */
	return 0;
}

int fsx_pull(struct fsx_xfer *x, u64 raddr, u32 rkey)
{
	struct fsx_conn *conn = x->conn;
	int ret;

	/* BUG: rdma-local-mr-management -- the server takes MRs from its own pool */
	x->mr = ib_mr_pool_get(conn->qp, &conn->qp->rdma_mrs);
	if (!x->mr)
		return -EAGAIN;

	ret = fsx_reg_sink(x);
	if (ret) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the server's pool */
		ib_mr_pool_put(conn->qp, &conn->qp->rdma_mrs, x->mr); /* OK: rdma-mr-leak -- returned on the failure path */
		x->mr = NULL;
		return ret;
	}

	x->sge.addr = x->mr->iova;
	x->sge.length = x->mr->length;
	x->sge.lkey = x->mr->lkey;
	x->rdma_wr.wr.next = NULL;
	x->rdma_wr.wr.wr_cqe = &x->cqe;
	x->rdma_wr.wr.sg_list = &x->sge;
	x->rdma_wr.wr.num_sge = 1;
	x->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	/* OK: rdma-access-flags-transport -- the transport test picks the opcode, not access flags */
	if (rdma_cap_read_inv(conn->ibdev, conn->port_num)) {
		x->rdma_wr.wr.opcode = IB_WR_RDMA_READ_WITH_INV;
		x->rdma_wr.wr.ex.invalidate_rkey = x->mr->lkey;
	} else {
		x->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	}
	x->rdma_wr.remote_addr = raddr;
	x->rdma_wr.rkey = rkey;
	x->reg_wr.wr.next = &x->rdma_wr.wr;

	return ib_post_send(conn->qp, &x->reg_wr.wr, NULL);
}

int fsx_reg_reply_source(struct fsx_xfer *x)
{
	struct fsx_conn *conn = x->conn;
	bool iw = rdma_cap_read_inv(conn->ibdev, conn->port_num);
	int n;

	/* BUG: rdma-local-mr-management -- the server maps the reply into its MR */
	n = ib_map_mr_sg(x->mr, x->sgl, x->nents, NULL, SZ_4K);
	if (n != x->nents)
		return -EINVAL;

	ib_update_fast_reg_key(x->mr, ib_inc_rkey(x->mr->rkey));
	x->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the server */
	x->reg_wr.mr = x->mr;
	x->reg_wr.key = x->mr->rkey;
	/* BUG: rdma-access-flags-transport, rdma-remote-access-overbroad -- a ternary on rdma_cap_read_inv() decides the rights; and a WRITE source's key never reaches the peer, so REMOTE_WRITE is of no use on any transport */
	x->reg_wr.access = iw ? IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
				IB_ACCESS_LOCAL_WRITE;
	return 0;
}
