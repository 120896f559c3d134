// SPDX-License-Identifier: GPL-2.0
/*
 * ckpt: request handling of an invented checkpoint-streaming client
 * ("ckpt") that writes memory snapshots to a remote store. Each chunk
 * request takes a pool MR, registers the chunk for the store to RDMA READ,
 * and sends a descriptor.
 *
 * Three handle-lifetime bugs of the kind that turn up in error paths:
 * ckpt_submit() drops the request's MR (req->mr = NULL) when the post
 * returns -EAGAIN and the request is requeued; ckpt_abort_unsent() frees a
 * request that still holds its MR; and ckpt_conn_destroy() frees the
 * connection together with the scratch MR allocated in ckpt_conn_init(),
 * which nothing deregisters. The paths that put the MR back first are fine.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct ckpt_conn {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_mr		*scratch_mr;
	struct list_head	requeue;
};

struct ckpt_req {
	struct ckpt_conn	*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct scatterlist	*sgl;
	int			nents;
	struct list_head	entry;
	__be32			rkey;
};

int ckpt_conn_init(struct ckpt_conn *conn)
{
	INIT_LIST_HEAD(&conn->requeue);
	/* BUG: rdma-local-mr-management -- the client allocates its own MR */
	conn->scratch_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, 16);
	if (IS_ERR(conn->scratch_mr))
		return PTR_ERR(conn->scratch_mr);
	return 0;
}

void ckpt_conn_destroy(struct ckpt_conn *conn)
{
	ib_destroy_qp(conn->qp);
	kfree(conn); /* BUG: rdma-mr-leak -- conn->scratch_mr is freed with its holder; nothing ever deregisters it */
}

static int ckpt_map(struct ckpt_req *req)
{
	struct ckpt_conn *conn = req->conn;

	/* BUG: rdma-local-mr-management -- per-chunk MR from the client's own pool */
	req->mr = ib_mr_pool_get(conn->qp, &conn->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the client maps the chunk into its MR */
	if (ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K) !=
	    req->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(conn->qp, &conn->qp->rdma_mrs, req->mr);
		req->mr = NULL; /* OK: rdma-mr-leak -- cleared after the MR was put back */
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_REMOTE_READ;
	req->rkey = cpu_to_be32(req->mr->rkey);
	return 0;
}

int ckpt_submit(struct ckpt_req *req)
{
	struct ckpt_conn *conn = req->conn;
	int ret;

	ret = ckpt_map(req);
	if (ret)
		return ret;

	ret = ib_post_send(conn->qp, &req->reg_wr.wr, NULL);
	if (ret == -EAGAIN) {
		/* send queue full: try the whole chunk again later */
		req->mr = NULL; /* BUG: rdma-mr-leak -- the pool MR is overwritten without being put back */
		list_add_tail(&req->entry, &conn->requeue);
		return 0;
	}
	return ret;
}

void ckpt_abort_unsent(struct ckpt_req *req)
{
	list_del(&req->entry);
	kfree(req); /* BUG: rdma-mr-leak -- called for requests that ckpt_map() mapped but that were never posted: req->mr still holds the pool MR */
}

void ckpt_cancel_mapped(struct ckpt_req *req)
{
	struct ckpt_conn *conn = req->conn;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(conn->qp, &conn->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- never posted: the REG_MR of a cancelled request did not go out */
		req->mr = NULL;
	}
	kfree(req); /* OK: rdma-mr-leak -- the MR was put back before the request is freed */
}
