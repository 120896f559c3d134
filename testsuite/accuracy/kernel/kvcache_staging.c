// SPDX-License-Identifier: GPL-2.0
/*
 * kvc: an invented in-kernel key-value cache client. Values larger than the
 * inline limit are fetched by the server pushing them into a per-connection
 * staging area; small values are copied out of the receive buffer.
 *
 * The staging area is fast-registered once at connection setup with
 * LOCAL_WRITE | REMOTE_WRITE, and its rkey is sent in the hello message:
 * fine. The request-header area is also fast-registered, with
 * LOCAL_WRITE | REMOTE_READ, but only its lkey is ever used (as the SGE of
 * the request SENDs); its rkey never leaves this file, so the REMOTE_READ
 * right is attack surface nobody needs (local_dma_lkey would do).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct kvc_hello {
	__be64	staging_addr;
	__be32	staging_rkey;
	__be32	staging_len;
};

struct kvc_conn {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_mr		*staging_mr;
	struct ib_mr		*hdr_mr;
	struct scatterlist	staging_sg;
	struct scatterlist	hdr_sg;
	struct ib_cqe		reg_cqe;
	struct completion	reg_done;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
};

static void kvc_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvc_conn *c = container_of(wc->wr_cqe, struct kvc_conn, reg_cqe);

	complete(&c->reg_done);
}

static int kvc_reg_once(struct kvc_conn *c, struct ib_mr *mr,
			struct scatterlist *sg, int access)
{
	struct ib_reg_wr wr = { };

	/* BUG: rdma-local-mr-management -- the client maps memory into its own MR */
	if (ib_map_mr_sg(mr, sg, 1, NULL, SZ_4K) != 1)
		return -EINVAL;
	wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the client */
	wr.wr.wr_cqe = &c->reg_cqe;
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.mr = mr; /* OK: rdma-rkey-reuse -- each of the two MRs is registered once for the connection */
	wr.key = mr->rkey;
	wr.access = access;
	reinit_completion(&c->reg_done);
	if (ib_post_send(c->qp, &wr.wr, NULL))
		return -EIO;
	wait_for_completion(&c->reg_done);
	return 0;
}

int kvc_setup(struct kvc_conn *c, struct kvc_hello *hello)
{
	int ret;

	c->reg_cqe.done = kvc_reg_done;
	init_completion(&c->reg_done);

	/* BUG: rdma-local-mr-management -- the client allocates its own MR */
	c->staging_mr = ib_alloc_mr(c->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- connection setup (kvc_reg_once() posts, but once per connection) */
	if (IS_ERR(c->staging_mr))
		return PTR_ERR(c->staging_mr);
	/* BUG: rdma-local-mr-management -- the client allocates its own MR */
	c->hdr_mr = ib_alloc_mr(c->pd, IB_MR_TYPE_MEM_REG, 1);
	if (IS_ERR(c->hdr_mr)) {
		ret = PTR_ERR(c->hdr_mr);
		goto out_staging;
	}

	/* OK: rdma-remote-access-overbroad, rdma-access-flags-invalid -- the staging rkey goes to the server in the hello */
	ret = kvc_reg_once(c, c->staging_mr, &c->staging_sg,
			   IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE);
	if (ret)
		goto out_hdr;
	/* BUG: rdma-remote-access-overbroad -- REMOTE_READ on the header MR, whose rkey is never sent: only its lkey is used */
	ret = kvc_reg_once(c, c->hdr_mr, &c->hdr_sg,
			   IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ);
	if (ret)
		goto out_hdr;

	hello->staging_addr = cpu_to_be64(c->staging_mr->iova);
	hello->staging_rkey = cpu_to_be32(c->staging_mr->rkey);
	hello->staging_len = cpu_to_be32(c->staging_mr->length);
	return 0;

out_hdr:
	/* BUG: rdma-local-mr-management -- the client deregisters its MR */
	ib_dereg_mr(c->hdr_mr);
out_staging:
	/* BUG: rdma-local-mr-management -- the client deregisters its MR */
	ib_dereg_mr(c->staging_mr); /* OK: rdma-mr-leak -- both MRs are released on the error paths */
	return ret;
}

int kvc_send_get(struct kvc_conn *c, u32 offset, u32 len)
{
	c->send_sge.addr = c->hdr_mr->iova + offset;
	c->send_sge.length = len;
	c->send_sge.lkey = c->hdr_mr->lkey;
	c->send_wr.next = NULL;
	c->send_wr.wr_cqe = &c->send_cqe;
	c->send_wr.sg_list = &c->send_sge;
	c->send_wr.num_sge = 1;
	c->send_wr.opcode = IB_WR_SEND;
	c->send_wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(c->qp, &c->send_wr, NULL);
}

void kvc_teardown(struct kvc_conn *c)
{
	/* BUG: rdma-local-mr-management -- the client deregisters its MR */
	ib_dereg_mr(c->hdr_mr);
	/* BUG: rdma-local-mr-management -- the client deregisters its MR */
	ib_dereg_mr(c->staging_mr);
}
