#include "demo.h"

int demo_invalidate(struct demo_queue *q, struct demo_mr *m)
{
	m->inv_wr.opcode = IB_WR_LOCAL_INV;
	m->inv_wr.ex.invalidate_rkey = m->mr->rkey;
	m->inv_wr.send_flags = IB_SEND_SIGNALED;
	m->inv_wr.next = NULL;
	return ib_post_send(q->qp, &m->inv_wr, NULL);
}
