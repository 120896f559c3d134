// SPDX-License-Identifier: GPL-2.0
/*
 * stor: QP creation of an invented storage-replication service ("stor")
 * split across helpers: stor_init_qp_attr() fills the capabilities from its
 * arguments and stor_create_qp() creates the QP.
 *
 * The replication QP passes a constant 2048 as the queue depth and nothing
 * on the way (caller, filler, creator) looks at attrs.max_qp_wr, so the QP
 * cannot be created on devices with 1024-entry queues. The I/O QP clamps its
 * depth to the device's max_qp_wr first, and the admin QP's 32 entries are
 * within every device's limits.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

#define STOR_REPL_DEPTH		2048
#define STOR_IO_DEPTH		4096
#define STOR_ADMIN_DEPTH	32

struct stor_dev {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*repl_qp;
	struct ib_qp		*io_qp;
	struct ib_qp		*admin_qp;
};

static void stor_init_qp_attr(struct stor_dev *d, struct ib_qp_init_attr *attr,
			      u32 depth)
{
	memset(attr, 0, sizeof(*attr));
	attr->send_cq = d->cq;
	attr->recv_cq = d->cq;
	attr->qp_type = IB_QPT_RC;
	attr->cap.max_send_wr = depth;
	attr->cap.max_recv_wr = depth;
	attr->cap.max_send_sge = 2;
	attr->cap.max_recv_sge = 1;
}

static struct ib_qp *stor_create_qp(struct stor_dev *d, u32 depth)
{
	struct ib_qp_init_attr attr;

	stor_init_qp_attr(d, &attr, depth);
	return ib_create_qp(d->pd, &attr);
}

int stor_open_replication(struct stor_dev *d)
{
	/* BUG(file): rdma-queue-cap-unchecked -- 2048 send and receive WRs reach ib_create_qp() without any comparison with attrs.max_qp_wr */
	d->repl_qp = stor_create_qp(d, STOR_REPL_DEPTH);
	if (IS_ERR(d->repl_qp))
		return PTR_ERR(d->repl_qp);
	return 0;
}

int stor_open_io(struct stor_dev *d)
{
	/* OK: rdma-queue-cap-unchecked -- the 4096 default is clamped to the device's max_qp_wr before use */
	u32 depth = min_t(u32, STOR_IO_DEPTH, d->ibdev->attrs.max_qp_wr);

	d->io_qp = stor_create_qp(d, depth);
	if (IS_ERR(d->io_qp))
		return PTR_ERR(d->io_qp);
	return 0;
}

int stor_open_admin(struct stor_dev *d)
{
	/* OK: rdma-queue-cap-unchecked -- 32 entries fit every RDMA device */
	d->admin_qp = stor_create_qp(d, STOR_ADMIN_DEPTH);
	if (IS_ERR(d->admin_qp))
		return PTR_ERR(d->admin_qp);
	return 0;
}

int stor_send(struct ib_qp *qp, struct ib_sge *sge, int nsge)
{
	struct ib_send_wr wr = {
		.opcode = IB_WR_SEND,
		.sg_list = sge,
		.num_sge = nsge,
		.send_flags = IB_SEND_SIGNALED,
	};

	return ib_post_send(qp, &wr, NULL);
}
