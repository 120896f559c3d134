// SPDX-License-Identifier: GPL-2.0
/*
 * kcl: the chunk pipeline of an invented in-kernel collective-operations
 * library ("kcl") used by a cluster filesystem for all-gather of metadata.
 * Each chunk is registered for the peer to RDMA READ, announced with a SEND,
 * and released when the peer's completion message arrives.
 *
 * The registration lives in helpers: kcl_prepare_chunk() allocates a fresh
 * MR for every chunk and kcl_release_chunk() deregisters it. The first is
 * called from kcl_send_chunk(), which posts, and the second from the
 * completion handler, so both device commands run once per chunk. The
 * communicator's header MR is allocated in kcl_comm_init(), which posts
 * nothing and runs once.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct kcl_comm {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_mr		*hdr_mr;
};

struct kcl_chunk {
	struct kcl_comm		*comm;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		sge;
	struct ib_cqe		send_cqe;
	struct ib_cqe		done_cqe;	/* the peer's "chunk read" message */
	struct scatterlist	*sgl;
	int			nents;
	__be32			*wire_rkey;
	u64			ann_dma;
};

int kcl_comm_init(struct kcl_comm *comm)
{
	/* BUG: rdma-local-mr-management -- the library allocates its own MR */
	comm->hdr_mr = ib_alloc_mr(comm->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- once per communicator, nothing posted here */
	if (IS_ERR(comm->hdr_mr))
		return PTR_ERR(comm->hdr_mr);
	return 0;
}

void kcl_comm_destroy(struct kcl_comm *comm)
{
	/* BUG: rdma-local-mr-management -- the library deregisters its MR */
	ib_dereg_mr(comm->hdr_mr);
}

static int kcl_prepare_chunk(struct kcl_chunk *c)
{
	/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- called from kcl_send_chunk() for every chunk */
	c->mr = ib_alloc_mr(c->comm->pd, IB_MR_TYPE_MEM_REG, c->nents);
	if (IS_ERR(c->mr))
		return PTR_ERR(c->mr);
	/* BUG: rdma-local-mr-management -- the library maps the chunk into its MR */
	if (ib_map_mr_sg(c->mr, c->sgl, c->nents, NULL, SZ_4K) != c->nents) {
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- per-chunk deregistration on the error path of the send */
		ib_dereg_mr(c->mr); /* OK: rdma-mr-leak -- released before the error return */
		c->mr = NULL;
		return -EINVAL;
	}
	memset(&c->reg_wr, 0, sizeof(c->reg_wr));
	c->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the library */
	c->reg_wr.wr.next = &c->send_wr;
	c->reg_wr.mr = c->mr; /* OK: rdma-rkey-reuse -- a fresh MR per chunk, registered once */
	c->reg_wr.key = c->mr->rkey;
	c->reg_wr.access = IB_ACCESS_REMOTE_READ;
	*c->wire_rkey = cpu_to_be32(c->mr->rkey);
	return 0;
}

static void kcl_release_chunk(struct kcl_chunk *c)
{
	/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- reached from the completion handler once per chunk */
	ib_dereg_mr(c->mr); /* OK: rdma-invalidation-leak -- deregistration kills the peer's key */
	c->mr = NULL;
}

static void kcl_chunk_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kcl_chunk *c = container_of(wc->wr_cqe, struct kcl_chunk,
					   done_cqe);

	kcl_release_chunk(c);
}

static void kcl_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("kcl: announce failed: %s\n", ib_wc_status_msg(wc->status));
}

int kcl_send_chunk(struct kcl_chunk *c)
{
	int ret = kcl_prepare_chunk(c);

	if (ret)
		return ret;
	c->sge.addr = c->ann_dma;
	c->sge.length = 32;
	c->sge.lkey = c->comm->pd->local_dma_lkey;
	c->done_cqe.done = kcl_chunk_done;
	c->send_cqe.done = kcl_send_done;
	c->send_wr.next = NULL;
	c->send_wr.wr_cqe = &c->send_cqe;
	c->send_wr.opcode = IB_WR_SEND;
	c->send_wr.sg_list = &c->sge;
	c->send_wr.num_sge = 1;
	c->send_wr.send_flags = IB_SEND_SIGNALED;
	ret = ib_post_send(c->comm->qp, &c->reg_wr.wr, NULL);
	if (ret)
		kcl_release_chunk(c);
	return ret;
}
