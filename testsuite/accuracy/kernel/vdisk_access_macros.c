// SPDX-License-Identifier: GPL-2.0
/*
 * vd: the registration helpers of an invented virtual-disk initiator that
 * builds its REG_MR work requests through macros: one access macro per
 * buffer role and a compound-literal initializer for the work request.
 *
 * The bug: VD_ACCESS_RW, used for buffers the server may both read and
 * write (read-modify-write of a partial block), has REMOTE_WRITE without
 * LOCAL_WRITE, so those registrations complete in error. VD_ACCESS_SINK
 * has LOCAL_WRITE, and VD_ACCESS_SRC (REMOTE_READ only) needs none. Keys are
 * rotated in vd_get_mr() before every registration, and every rkey is put
 * into the wire descriptor.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define VD_ACCESS_LOCAL	IB_ACCESS_LOCAL_WRITE
#define VD_ACCESS_SRC	IB_ACCESS_REMOTE_READ
#define VD_ACCESS_SINK	(VD_ACCESS_LOCAL | IB_ACCESS_REMOTE_WRITE)
#define VD_ACCESS_RW	(IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE)

#define VD_REG_WR(_mr, _cqe, _acc)				\
	((struct ib_reg_wr) {					\
		.wr = {						\
			.opcode = IB_WR_REG_MR,			\
			.wr_cqe = (_cqe),			\
			.num_sge = 0,				\
		},						\
		.mr = (_mr),					\
		.key = (_mr)->rkey,				\
		.access = (_acc),				\
	})

enum vd_role {
	VD_ROLE_SRC,
	VD_ROLE_SINK,
	VD_ROLE_RMW,
};

struct vd_desc {
	__be64	addr;
	__be32	rkey;
	__be32	len;
};

struct vd_queue {
	struct ib_qp		*qp;
	struct ib_pd		*pd;
};

struct vd_req {
	struct vd_queue		*q;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct scatterlist	*sgl;
	int			nents;
	struct vd_desc		desc;
};

static int vd_get_mr(struct vd_req *req)
{
	int n;

	/* BUG: rdma-local-mr-management -- per-request MR from the driver's own pool */
	req->mr = ib_mr_pool_get(req->q->qp, &req->q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;

	/* BUG: rdma-local-mr-management -- the driver maps pages into its MR */
	n = ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K);
	if (n != req->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(req->q->qp, &req->q->qp->rdma_mrs, req->mr); /* OK: rdma-mr-leak -- short map puts the MR back */
		req->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	return 0;
}

static void vd_fill_desc(struct vd_req *req)
{
	req->desc.addr = cpu_to_be64(req->mr->iova);
	req->desc.rkey = cpu_to_be32(req->mr->rkey);
	req->desc.len = cpu_to_be32(req->mr->length);
}

int vd_reg_src(struct vd_req *req)
{
	int ret = vd_get_mr(req);

	if (ret)
		return ret;
	/* BUG: rdma-local-mr-management -- REG_MR work request built by the driver */
	req->reg_wr = VD_REG_WR(req->mr, &req->reg_cqe, VD_ACCESS_SRC); /* OK: rdma-access-flags-invalid, rdma-rkey-reuse -- REMOTE_READ alone needs no LOCAL_WRITE; vd_get_mr() rotated the key */
	vd_fill_desc(req);
	return ib_post_send(req->q->qp, &req->reg_wr.wr, NULL);
}

int vd_reg_sink(struct vd_req *req)
{
	int ret = vd_get_mr(req);

	if (ret)
		return ret;
	/* BUG: rdma-local-mr-management -- REG_MR work request built by the driver */
	req->reg_wr = VD_REG_WR(req->mr, &req->reg_cqe, VD_ACCESS_SINK); /* OK: rdma-access-flags-invalid -- the sink macro includes LOCAL_WRITE */
	vd_fill_desc(req);
	return ib_post_send(req->q->qp, &req->reg_wr.wr, NULL);
}

int vd_reg_rmw(struct vd_req *req)
{
	int ret = vd_get_mr(req);

	if (ret)
		return ret;
	/* BUG: rdma-local-mr-management -- REG_MR work request built by the driver */
	req->reg_wr = VD_REG_WR(req->mr, &req->reg_cqe, VD_ACCESS_RW); /* BUG: rdma-access-flags-invalid -- VD_ACCESS_RW grants REMOTE_WRITE without LOCAL_WRITE */
	vd_fill_desc(req);
	return ib_post_send(req->q->qp, &req->reg_wr.wr, NULL);
}

int vd_reg_for_role(struct vd_req *req, enum vd_role role)
{
	switch (role) {
	case VD_ROLE_SRC:
		return vd_reg_src(req);
	case VD_ROLE_SINK:
		return vd_reg_sink(req);
	case VD_ROLE_RMW:
		return vd_reg_rmw(req);
	}
	return -EINVAL;
}
