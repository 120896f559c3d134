// SPDX-License-Identifier: GPL-2.0
/*
 * lab: an invented RDMA benchmark ULP ("lab") for trusted lab fabrics.
 *
 * Its PD always carries IB_PD_UNSAFE_GLOBAL_RKEY (one rkey for all of kernel
 * memory, which the benchmark hands to the peer), and its per-device control
 * PD gets the same flag through lab_pd_flags(). Its bounce buffer is
 * fast-registered with REMOTE_WRITE although only its lkey is ever used (as
 * the source of the benchmark's own RDMA WRITEs): a right no peer can use.
 * The reply buffer is registered LOCAL_WRITE-only, as it should be, and the
 * statistics PD is allocated without flags.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

struct lab_dev {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_pd		*ctrl_pd;
	struct ib_pd		*stats_pd;
	struct ib_qp		*qp;
	struct ib_mr		*bounce_mr;
	struct ib_mr		*reply_mr;
	struct scatterlist	bounce_sg;
	struct scatterlist	reply_sg;
	u32			global_rkey;
};

static unsigned int lab_pd_flags(void)
{
	return IB_PD_UNSAFE_GLOBAL_RKEY;
}

int lab_open(struct lab_dev *d)
{
	/* BUG: rdma-remote-access-overbroad -- the PD's global rkey opens all of kernel memory to the peer */
	d->pd = ib_alloc_pd(d->ibdev, IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(d->pd))
		return PTR_ERR(d->pd);
	d->global_rkey = d->pd->unsafe_global_rkey;

	/* BUG: rdma-remote-access-overbroad -- the flag comes through a helper, with the same effect */
	d->ctrl_pd = ib_alloc_pd(d->ibdev, lab_pd_flags());
	if (IS_ERR(d->ctrl_pd))
		return PTR_ERR(d->ctrl_pd);

	/* OK: rdma-remote-access-overbroad -- no global rkey for the statistics PD */
	d->stats_pd = ib_alloc_pd(d->ibdev, 0);
	if (IS_ERR(d->stats_pd))
		return PTR_ERR(d->stats_pd);
	return 0;
}

static int lab_reg(struct lab_dev *d, struct ib_mr *mr, struct scatterlist *sg,
		   int access)
{
	struct ib_reg_wr wr = { };

	/* BUG: rdma-local-mr-management -- the benchmark maps its buffer into its MR */
	if (ib_map_mr_sg(mr, sg, 1, NULL, SZ_4K) != 1)
		return -EINVAL;
	wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the benchmark */
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.mr = mr; /* OK: rdma-rkey-reuse -- both buffers are registered once at open */
	wr.key = mr->rkey;
	wr.access = access;
	return ib_post_send(d->qp, &wr.wr, NULL);
}

int lab_setup_buffers(struct lab_dev *d)
{
	int ret;

	/* BUG: rdma-local-mr-management -- the benchmark allocates its own MR */
	d->bounce_mr = ib_alloc_mr(d->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- buffers are set up once at open */
	if (IS_ERR(d->bounce_mr))
		return PTR_ERR(d->bounce_mr);
	/* BUG: rdma-local-mr-management -- the benchmark allocates its own MR */
	d->reply_mr = ib_alloc_mr(d->pd, IB_MR_TYPE_MEM_REG, 1);
	if (IS_ERR(d->reply_mr))
		return PTR_ERR(d->reply_mr); /* OK: rdma-mr-leak -- bounce_mr stays in the device and lab_close(), which the open path calls on failure, deregisters it */

	/* BUG: rdma-remote-access-overbroad -- REMOTE_WRITE on a buffer whose rkey never leaves this file; it is only the source of local WRITEs */
	ret = lab_reg(d, d->bounce_mr, &d->bounce_sg,
		      IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE);
	if (ret)
		return ret;
	/* OK: rdma-remote-access-overbroad -- local access only */
	return lab_reg(d, d->reply_mr, &d->reply_sg, IB_ACCESS_LOCAL_WRITE);
}

int lab_write(struct lab_dev *d, u32 len, u64 raddr, u32 rkey)
{
	struct ib_sge sge = {
		.addr = d->bounce_mr->iova,
		.length = len,
		.lkey = d->bounce_mr->lkey,
	};
	struct ib_rdma_wr wr = {
		.wr = {
			.opcode = IB_WR_RDMA_WRITE,
			.sg_list = &sge,
			.num_sge = 1,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = raddr,
		.rkey = rkey,
	};

	return ib_post_send(d->qp, &wr.wr, NULL);
}

void lab_close(struct lab_dev *d)
{
	if (d->reply_mr && !IS_ERR(d->reply_mr))
		/* BUG: rdma-local-mr-management -- the benchmark deregisters its MR */
		ib_dereg_mr(d->reply_mr);
	/* BUG: rdma-local-mr-management -- the benchmark deregisters its MR */
	ib_dereg_mr(d->bounce_mr);
	ib_dealloc_pd(d->stats_pd);
	ib_dealloc_pd(d->ctrl_pd);
	ib_dealloc_pd(d->pd);
}
