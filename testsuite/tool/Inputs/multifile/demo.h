/* A ULP split over files, like xprtrdma's frwr_ops.c / rpc_rdma.c. */
#include <rdma/mr_pool.h>

struct demo_queue {
	struct ib_qp *qp;
};

struct demo_mr {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr;
};

int demo_register(struct demo_queue *q, struct demo_mr *m);
void demo_put(struct demo_queue *q, struct demo_mr *m);
int demo_invalidate(struct demo_queue *q, struct demo_mr *m);
