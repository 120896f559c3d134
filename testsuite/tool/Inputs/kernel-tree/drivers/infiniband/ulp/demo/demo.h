/* SPDX-License-Identifier: GPL-2.0 */
#include <rdma/ib_verbs.h>

struct demo_req {
	struct ib_qp *qp;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
};
