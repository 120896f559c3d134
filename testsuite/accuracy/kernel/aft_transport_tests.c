// SPDX-License-Identifier: GPL-2.0
/*
 * lmig: the page-transfer engine of an invented live-migration helper
 * ("lmig") that pulls guest pages from the source host with RDMA READs into
 * fast-registered sinks on the destination.
 *
 * On iWARP the sink of an RDMA READ needs REMOTE_WRITE. lmig_reg_sink()
 * derives that from a local boolean set by rdma_protocol_iwarp(), and
 * lmig_reg_sink_legacy() from rdma_node_get_transport() compared with
 * RDMA_TRANSPORT_IWARP: both are inline transport tests deciding access
 * flags, the knowledge rdma_rw keeps in one place. lmig_pull_dirty() forgot
 * the rule altogether: its sink is registered LOCAL_WRITE-only on every path
 * and then used by an RDMA READ, which fails on iWARP. The WRITE-back path
 * registers its source LOCAL_WRITE-only, which is right on every transport.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

struct lmig_conn {
	struct ib_device	*ibdev;
	struct ib_qp		*qp;
	u32			port;
	unsigned int		node_type;
};

struct lmig_xfer {
	struct lmig_conn	*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	rdma_wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	struct scatterlist	*sgl;
	int			nents;
};

static int lmig_map(struct lmig_xfer *x)
{
	/* BUG: rdma-local-mr-management -- the engine maps guest pages into its MR */
	if (ib_map_mr_sg(x->mr, x->sgl, x->nents, NULL, SZ_4K) != x->nents)
		return -EINVAL;
	ib_update_fast_reg_key(x->mr, ib_inc_rkey(x->mr->rkey));
	memset(&x->reg_wr, 0, sizeof(x->reg_wr));
	x->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the engine */
	x->reg_wr.mr = x->mr;
	x->reg_wr.key = x->mr->rkey;
	return 0;
}

static void lmig_build_rdma(struct lmig_xfer *x, enum ib_wr_opcode op,
			    u64 raddr, u32 rkey)
{
	x->sge.addr = x->mr->iova;
	x->sge.length = x->mr->length;
	x->sge.lkey = x->mr->lkey;
	x->rdma_wr.wr.opcode = op;
	x->rdma_wr.wr.wr_cqe = &x->cqe;
	x->rdma_wr.wr.sg_list = &x->sge;
	x->rdma_wr.wr.num_sge = 1;
	x->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	x->rdma_wr.wr.next = NULL;
	x->rdma_wr.remote_addr = raddr;
	x->rdma_wr.rkey = rkey;
	x->reg_wr.wr.next = &x->rdma_wr.wr;
}

int lmig_reg_sink(struct lmig_xfer *x, u64 raddr, u32 rkey)
{
	bool iw = rdma_protocol_iwarp(x->conn->ibdev, x->conn->port);
	int acc = IB_ACCESS_LOCAL_WRITE;

	if (lmig_map(x))
		return -EINVAL;
	if (iw)
		acc |= IB_ACCESS_REMOTE_WRITE;
	/* OK: rdma-remote-access-overbroad -- on iWARP the READ request hands the sink's STag to the source host, which places the response with it */
	x->reg_wr.access = acc; /* BUG: rdma-access-flags-transport -- the sink's rights come from a local boolean set by rdma_protocol_iwarp() */
	lmig_build_rdma(x, IB_WR_RDMA_READ, raddr, rkey);
	return ib_post_send(x->conn->qp, &x->reg_wr.wr, NULL);
}

int lmig_reg_sink_legacy(struct lmig_xfer *x, u64 raddr, u32 rkey)
{
	if (lmig_map(x))
		return -EINVAL;
	if (rdma_node_get_transport(x->conn->node_type) == RDMA_TRANSPORT_IWARP)
		/* BUG: rdma-access-flags-transport -- rights chosen by comparing the node's transport with RDMA_TRANSPORT_IWARP */
		x->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	else
		x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	lmig_build_rdma(x, IB_WR_RDMA_READ, raddr, rkey);
	return ib_post_send(x->conn->qp, &x->reg_wr.wr, NULL);
}

int lmig_pull_dirty(struct lmig_xfer *x, u64 raddr, u32 rkey)
{
	if (lmig_map(x))
		return -EINVAL;
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	lmig_build_rdma(x, IB_WR_RDMA_READ, raddr, rkey);
	/* BUG: rdma-access-flags-transport -- the READ's sink MR has no REMOTE_WRITE on any path; the pull fails on iWARP devices */
	return ib_post_send(x->conn->qp, &x->reg_wr.wr, NULL);
}

int lmig_push_back(struct lmig_xfer *x, u64 raddr, u32 rkey)
{
	if (lmig_map(x))
		return -EINVAL;
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	lmig_build_rdma(x, IB_WR_RDMA_WRITE, raddr, rkey);
	/* OK: rdma-access-flags-transport -- an RDMA WRITE source needs no remote rights on any transport */
	return ib_post_send(x->conn->qp, &x->reg_wr.wr, NULL);
}
