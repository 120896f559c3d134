// SPDX-License-Identifier: GPL-2.0
/* A ULP of the stand-in tree: its registration lacks LOCAL_WRITE. */
#include "demo.h"

int demo_map(struct demo_req *req)
{
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(req->qp, &req->reg_wr.wr, NULL);
}
