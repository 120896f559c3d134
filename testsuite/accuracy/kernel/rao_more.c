// SPDX-License-Identifier: GPL-2.0
/*
 * qlk: the lock-table client of an invented distributed lock manager
 * ("qlk"). Lock words live in a table that servers update with RDMA atomics,
 * so the table MR needs REMOTE_ATOMIC and its rkey goes to every server in
 * the join message (right). Two other registrations grant rights nobody can
 * use:
 *
 *   - the request-staging MR gets REMOTE_READ, but its rkey is only ever
 *     compared (to recognise a remote invalidation) and invalidated; no
 *     server ever learns it;
 *   - the reply ring is registered with REMOTE_WRITE although servers answer
 *     with SENDs into posted receives; only its lkey is used.
 *
 * All three MRs live in a struct private to this file.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct qlk_join_msg {
	__be64	table_addr;
	__be32	table_rkey;
};

struct qlk_client {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_mr		*table_mr;
	struct ib_mr		*staging_mr;
	struct ib_mr		*reply_mr;
	struct scatterlist	table_sg;
	struct scatterlist	staging_sg;
	struct scatterlist	reply_sg;
	struct ib_recv_wr	recv_wr;
	struct ib_sge		recv_sge;
	struct ib_send_wr	inv_wr;
};

static int qlk_reg(struct qlk_client *c, struct ib_mr *mr,
		   struct scatterlist *sg, int access)
{
	struct ib_reg_wr wr = { };

	/* BUG: rdma-local-mr-management -- the client maps memory into its own MR */
	if (ib_map_mr_sg(mr, sg, 1, NULL, SZ_4K) != 1)
		return -EINVAL;
	wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the client */
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.mr = mr; /* OK: rdma-rkey-reuse -- each MR is registered once at join */
	wr.key = mr->rkey;
	wr.access = access;
	return ib_post_send(c->qp, &wr.wr, NULL);
}

int qlk_join(struct qlk_client *c, struct qlk_join_msg *msg)
{
	int ret;

	/* OK: rdma-remote-access-overbroad, rdma-access-flags-invalid -- servers need REMOTE_ATOMIC on the table (with LOCAL_WRITE), and its rkey is in the join message */
	ret = qlk_reg(c, c->table_mr, &c->table_sg,
		      IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_ATOMIC |
		      IB_ACCESS_REMOTE_READ);
	if (ret)
		return ret;
	/* BUG: rdma-remote-access-overbroad -- the staging MR's rkey is only compared and invalidated, never sent */
	ret = qlk_reg(c, c->staging_mr, &c->staging_sg,
		      IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ);
	if (ret)
		return ret;
	/* BUG: rdma-remote-access-overbroad -- replies arrive by SEND; the ring's REMOTE_WRITE right is never usable */
	ret = qlk_reg(c, c->reply_mr, &c->reply_sg,
		      IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE);
	if (ret)
		return ret;

	msg->table_addr = cpu_to_be64(c->table_mr->iova);
	msg->table_rkey = cpu_to_be32(c->table_mr->rkey);
	return 0;
}

int qlk_post_reply_buf(struct qlk_client *c, u32 offset, u32 len)
{
	c->recv_sge.addr = c->reply_mr->iova + offset;
	c->recv_sge.length = len;
	c->recv_sge.lkey = c->reply_mr->lkey;
	c->recv_wr.next = NULL;
	c->recv_wr.sg_list = &c->recv_sge;
	c->recv_wr.num_sge = 1;
	return ib_post_recv(c->qp, &c->recv_wr, NULL);
}

bool qlk_staging_invalidated(struct qlk_client *c, struct ib_wc *wc)
{
	return (wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
	       wc->ex.invalidate_rkey == c->staging_mr->rkey;
}

int qlk_reset_staging(struct qlk_client *c)
{
	c->inv_wr.opcode = IB_WR_LOCAL_INV;
	c->inv_wr.next = NULL;
	c->inv_wr.num_sge = 0;
	c->inv_wr.send_flags = IB_SEND_SIGNALED;
	c->inv_wr.ex.invalidate_rkey = c->staging_mr->rkey;
	return ib_post_send(c->qp, &c->inv_wr, NULL);
}
