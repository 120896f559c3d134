// SPDX-License-Identifier: GPL-2.0
/* Another RDMA user, in another subtree (M= selects it or not). */
#include <rdma/ib_verbs.h>

struct rdsx_conn {
	struct ib_pd *pd;
	struct ib_mr *mr;
};

int rdsx_setup(struct rdsx_conn *c)
{
	c->mr = ib_alloc_mr(c->pd, IB_MR_TYPE_MEM_REG, 16);
	return 0;
}
