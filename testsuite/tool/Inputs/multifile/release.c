#include "demo.h"

void demo_put(struct demo_queue *q, struct demo_mr *m)
{
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, m->mr);
	m->mr = NULL;
}
