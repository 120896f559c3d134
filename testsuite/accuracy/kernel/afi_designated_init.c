// SPDX-License-Identifier: GPL-2.0
/*
 * pgx: registration of an invented remote-paging transport ("pgx") that
 * lets a memory server page cold memory in and out of the host. Work
 * requests are built with designated initializers and the access rights come
 * from the transport's own enum.
 *
 * Bugs: PGX_ACC_PAGE_IN is REMOTE_WRITE alone, and the swap-out path clears
 * LOCAL_WRITE from the default mask "because the host does not write the
 * page while it is out", leaving REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC
 * (the server updates the page's generation word atomically). Both REG_MRs
 * complete in error. The page-out path with PGX_ACC_PAGE_OUT (REMOTE_READ
 * only) and the metadata path with LOCAL_WRITE are right.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

enum {
	PGX_ACC_PAGE_OUT	= IB_ACCESS_REMOTE_READ,
	PGX_ACC_PAGE_IN		= IB_ACCESS_REMOTE_WRITE,
	PGX_ACC_DEFAULT		= IB_ACCESS_LOCAL_WRITE |
				  IB_ACCESS_REMOTE_WRITE |
				  IB_ACCESS_REMOTE_READ |
				  IB_ACCESS_REMOTE_ATOMIC,
};

struct pgx_conn {
	struct ib_qp	*qp;
};

struct pgx_page_req {
	struct pgx_conn		*conn;
	struct ib_mr		*mr;
	struct ib_cqe		cqe;
	struct scatterlist	sg;
	__be32			rkey;
	__be64			addr;
};

static int pgx_prep(struct pgx_page_req *r)
{
	/* BUG: rdma-local-mr-management -- the transport maps the page into its MR */
	if (ib_map_mr_sg(r->mr, &r->sg, 1, NULL, SZ_4K) != 1)
		return -EINVAL;
	ib_update_fast_reg_key(r->mr, ib_inc_rkey(r->mr->rkey));
	r->rkey = cpu_to_be32(r->mr->rkey);
	r->addr = cpu_to_be64(r->mr->iova);
	return 0;
}

int pgx_page_in(struct pgx_page_req *r)
{
	struct ib_reg_wr wr = {
		.wr = {
			.opcode = IB_WR_REG_MR, /* BUG: rdma-local-mr-management -- fast registration built by the transport */
			.wr_cqe = &r->cqe,
			.send_flags = IB_SEND_SIGNALED,
		},
		.mr = r->mr, /* OK: rdma-rkey-reuse -- pgx_prep() rotates the key before the post, and wr.key is refreshed after it */
		.key = r->mr->rkey,
		.access = PGX_ACC_PAGE_IN, /* BUG: rdma-access-flags-invalid -- PGX_ACC_PAGE_IN is REMOTE_WRITE without LOCAL_WRITE */
	};

	if (pgx_prep(r))
		return -EINVAL;
	wr.key = r->mr->rkey;
	return ib_post_send(r->conn->qp, &wr.wr, NULL);
}

int pgx_page_out(struct pgx_page_req *r)
{
	struct ib_reg_wr wr = {
		.wr = {
			.opcode = IB_WR_REG_MR, /* BUG: rdma-local-mr-management -- fast registration built by the transport */
			.wr_cqe = &r->cqe,
			.send_flags = IB_SEND_SIGNALED,
		},
		.mr = r->mr,
		.access = PGX_ACC_PAGE_OUT, /* OK: rdma-access-flags-invalid -- REMOTE_READ alone needs no LOCAL_WRITE */
	};

	if (pgx_prep(r))
		return -EINVAL;
	wr.key = r->mr->rkey;
	return ib_post_send(r->conn->qp, &wr.wr, NULL);
}

int pgx_swap_out(struct pgx_page_req *r)
{
	int access = PGX_ACC_DEFAULT & ~IB_ACCESS_LOCAL_WRITE;
	struct ib_reg_wr wr = {
		.wr = {
			.opcode = IB_WR_REG_MR, /* BUG: rdma-local-mr-management -- fast registration built by the transport */
			.wr_cqe = &r->cqe,
			.send_flags = IB_SEND_SIGNALED,
		},
		.mr = r->mr,
	};

	if (pgx_prep(r))
		return -EINVAL;
	wr.key = r->mr->rkey;
	wr.access = access; /* BUG: rdma-access-flags-invalid -- LOCAL_WRITE was masked out but REMOTE_WRITE and REMOTE_ATOMIC remain */
	return ib_post_send(r->conn->qp, &wr.wr, NULL);
}

int pgx_reg_meta(struct pgx_page_req *r)
{
	struct ib_reg_wr wr = {
		.wr = {
			.opcode = IB_WR_REG_MR, /* BUG: rdma-local-mr-management -- fast registration built by the transport */
			.wr_cqe = &r->cqe,
			.send_flags = IB_SEND_SIGNALED,
		},
		.mr = r->mr,
		.access = PGX_ACC_DEFAULT, /* OK: rdma-access-flags-invalid -- the default mask carries LOCAL_WRITE with the remote rights */
	};

	if (pgx_prep(r))
		return -EINVAL;
	wr.key = r->mr->rkey;
	return ib_post_send(r->conn->qp, &wr.wr, NULL);
}
