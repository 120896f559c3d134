// SPDX-License-Identifier: GPL-2.0
/* Another RDMA user, in another subtree (M= selects it or not). */
#include <linux/err.h>
#include <rdma/ib_verbs.h>

struct rdsx_conn {
	struct ib_pd *pd;
	struct ib_mr *mr;
};

int rdsx_map(struct rdsx_conn *c);

int rdsx_setup(struct rdsx_conn *c)
{
	struct ib_mr *mr = ib_alloc_mr(c->pd, IB_MR_TYPE_MEM_REG, 16);

	if (IS_ERR(mr))
		return PTR_ERR(mr);
	if (rdsx_map(c))
		return -EIO;
	c->mr = mr;
	return 0;
}
