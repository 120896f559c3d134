#include "demo.h"

int demo_register(struct demo_queue *q, struct demo_mr *m)
{
	m->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!m->mr)
		return -EAGAIN;
	ib_update_fast_reg_key(m->mr, ib_inc_rkey(m->mr->rkey));
	m->reg_wr.wr.opcode = IB_WR_REG_MR;
	m->reg_wr.mr = m->mr;
	m->reg_wr.key = m->mr->rkey;
	m->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(q->qp, &m->reg_wr.wr, NULL);
}
