// SPDX-License-Identifier: GPL-2.0
/*
 * gsx: scatter-gather helpers of an invented GPU-staging transport ("gsx")
 * that registers staging buffers for a remote peer. gsx_get_mr() takes an
 * MR from the QP's pool and maps the buffer into it, returning the MR (or an
 * ERR_PTR); callers own it from then on.
 *
 * gsx_post_write_sink() forgets the MR when the descriptor does not fit the
 * message: it returns -EMSGSIZE with the mapped MR still in a local. The
 * read-source path puts it back, and gsx_attach_mr() hands it to the request
 * on success, which is how ownership moves on: gsx_release() invalidates the
 * key and the LOCAL_INV's completion puts the MR back.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define GSX_MAX_DESC_LEN	(1U << 24)

struct gsx_conn {
	struct ib_qp	*qp;
};

struct gsx_req {
	struct gsx_conn		*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*sgl;
	int			nents;
	__be32			rkey;
	__be64			addr;
};

static struct ib_mr *gsx_get_mr(struct gsx_conn *c, struct scatterlist *sgl,
				int nents)
{
	struct ib_mr *mr;

	/* BUG: rdma-local-mr-management -- per-request MR from the transport's own pool */
	mr = ib_mr_pool_get(c->qp, &c->qp->rdma_mrs);
	if (!mr)
		return ERR_PTR(-EAGAIN);
	/* BUG: rdma-local-mr-management -- the transport maps the buffer into its MR */
	if (ib_map_mr_sg(mr, sgl, nents, NULL, SZ_4K) != nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, mr); /* OK: rdma-mr-leak -- released on the helper's own failure path */
		return ERR_PTR(-EINVAL);
	}
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	return mr;
}

static void gsx_build_reg(struct gsx_req *req, struct ib_mr *mr, int access)
{
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the transport */
	req->reg_wr.mr = mr; /* OK: rdma-rkey-reuse -- gsx_get_mr() rotated the key before returning the MR */
	req->reg_wr.key = mr->rkey;
	req->reg_wr.access = access;
	req->rkey = cpu_to_be32(mr->rkey);
	req->addr = cpu_to_be64(mr->iova);
}

int gsx_post_write_sink(struct gsx_req *req)
{
	struct gsx_conn *c = req->conn;
	struct ib_mr *mr;

	mr = gsx_get_mr(c, req->sgl, req->nents);
	if (IS_ERR(mr))
		return PTR_ERR(mr);	/* OK: rdma-mr-leak -- the helper failed and returned no MR */

	if (mr->length > GSX_MAX_DESC_LEN)
		return -EMSGSIZE; /* BUG: rdma-mr-leak -- the mapped pool MR is dropped with the local */

	gsx_build_reg(req, mr, IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE);
	req->mr = mr;
	return ib_post_send(c->qp, &req->reg_wr.wr, NULL);
}

int gsx_post_read_source(struct gsx_req *req)
{
	struct gsx_conn *c = req->conn;
	struct ib_mr *mr;

	mr = gsx_get_mr(c, req->sgl, req->nents);
	if (IS_ERR(mr))
		return PTR_ERR(mr);

	if (mr->length > GSX_MAX_DESC_LEN) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(c->qp, &c->qp->rdma_mrs, mr); /* OK: rdma-mr-leak -- put back before the error return */
		return -EMSGSIZE;
	}

	gsx_build_reg(req, mr, IB_ACCESS_REMOTE_READ);
	req->mr = mr;
	return ib_post_send(c->qp, &req->reg_wr.wr, NULL);
}

int gsx_attach_mr(struct gsx_req *req)
{
	struct ib_mr *mr = gsx_get_mr(req->conn, req->sgl, req->nents);

	if (IS_ERR(mr))
		return PTR_ERR(mr);
	req->mr = mr;
	return 0; /* OK: rdma-mr-leak -- ownership moves to the request, which puts the MR on completion */
}

static void gsx_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct gsx_req *req = container_of(wc->wr_cqe, struct gsx_req, inv_cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;	/* connection error: the pool goes away with the QP */
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(req->conn->qp, &req->conn->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- released from the completion of its LOCAL_INV */
	req->mr = NULL;
}

int gsx_release(struct gsx_req *req)
{
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.next = NULL;
	req->inv_wr.num_sge = 0;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	req->inv_cqe.done = gsx_inv_done;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	return ib_post_send(req->conn->qp, &req->inv_wr, NULL);
}
