// SPDX-License-Identifier: GPL-2.0
/*
 * objc: the client side of an invented object store ("objd") that lets the
 * server update per-object reference counters in client memory with RDMA
 * atomics, and read or write object payloads directly in client buffers.
 *
 * The counter page is registered once per connection; its access flags come
 * from a helper. Payload buffers are registered per request with flags that
 * depend on the direction. Every rkey goes to the server in the request.
 *
 * The bug: objc_counter_access() returns REMOTE_ATOMIC | REMOTE_READ without
 * LOCAL_WRITE, so the REG_MR of the counter page completes in error (the
 * verbs tie remote atomic and remote write access to local write access).
 * The payload registrations are correct: the server-writable branch carries
 * LOCAL_WRITE, and a read-only registration needs none.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct objc_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_mr		*ctr_mr;
	struct scatterlist	ctr_sg;
	struct ib_cqe		reg_cqe;
	struct completion	reg_done;
	int			reg_status;
};

struct objc_req {
	struct objc_conn	*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct scatterlist	*sgl;
	int			nents;
	bool			server_writes;
};

struct objc_wire_buf {
	__be64	addr;
	__be32	rkey;
	__be32	len;
};

static int objc_counter_access(void)
{
	return IB_ACCESS_REMOTE_ATOMIC | IB_ACCESS_REMOTE_READ;
}

static void objc_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct objc_conn *conn = container_of(wc->wr_cqe, struct objc_conn,
					      reg_cqe);

	conn->reg_status = wc->status;
	complete(&conn->reg_done);
}

int objc_register_counters(struct objc_conn *conn, struct objc_wire_buf *wb)
{
	struct ib_reg_wr reg_wr = { };
	int ret, n;

	/* BUG: rdma-local-mr-management -- the client allocates its own MR */
	conn->ctr_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- once per connection, although this function posts the registration */
	if (IS_ERR(conn->ctr_mr))
		return PTR_ERR(conn->ctr_mr);

	/* BUG: rdma-local-mr-management -- the client maps the counter page into its MR */
	n = ib_map_mr_sg(conn->ctr_mr, &conn->ctr_sg, 1, NULL, SZ_4K);
	if (n != 1) {
		ret = -EINVAL;
		goto out_dereg;
	}

	conn->reg_cqe.done = objc_reg_done;
	init_completion(&conn->reg_done);
	reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the client */
	reg_wr.wr.wr_cqe = &conn->reg_cqe;
	reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	reg_wr.mr = conn->ctr_mr; /* OK: rdma-rkey-reuse -- the counter MR is registered once for the connection's lifetime */
	reg_wr.key = conn->ctr_mr->rkey;
	reg_wr.access = objc_counter_access(); /* BUG: rdma-access-flags-invalid -- REMOTE_ATOMIC without LOCAL_WRITE: the REG_MR completes in error */

	ret = ib_post_send(conn->qp, &reg_wr.wr, NULL);
	if (ret)
		goto out_dereg;
	wait_for_completion(&conn->reg_done);
	if (conn->reg_status) {
		ret = -EIO;
		goto out_dereg;
	}

	wb->addr = cpu_to_be64(conn->ctr_mr->iova);
	wb->rkey = cpu_to_be32(conn->ctr_mr->rkey);
	wb->len = cpu_to_be32(conn->ctr_mr->length);
	return 0;

out_dereg:
	/* BUG: rdma-local-mr-management -- the client deregisters its MR */
	ib_dereg_mr(conn->ctr_mr); /* OK: rdma-mr-leak, rdma-invalidation-leak, rdma-registration-in-datapath -- the connection-setup error path releases the MR, and deregistration kills any key */
	conn->ctr_mr = NULL;
	return ret;
}

void objc_unregister_counters(struct objc_conn *conn)
{
	/* BUG: rdma-local-mr-management -- the client deregisters its MR */
	ib_dereg_mr(conn->ctr_mr);
	conn->ctr_mr = NULL;
}

int objc_prep_payload(struct objc_req *req, struct objc_wire_buf *wb)
{
	int access = IB_ACCESS_REMOTE_READ;
	int n;

	if (req->server_writes)
		access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	/* BUG: rdma-local-mr-management -- the client maps the payload into its MR */
	n = ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K);
	if (n != req->nents)
		return -EINVAL;

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- rotated on every path just above */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = access; /* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- REMOTE_WRITE only with LOCAL_WRITE; the key goes to the server below */

	wb->addr = cpu_to_be64(req->mr->iova);
	wb->rkey = cpu_to_be32(req->mr->rkey);
	wb->len = cpu_to_be32(req->mr->length);
	return 0;
}
