// SPDX-License-Identifier: GPL-2.0
/*
 * rsc: session login of an invented SCSI-over-RDMA initiator ("rsc"). The
 * login response is large, so the target RDMA WRITEs it into a buffer the
 * initiator registers for the login only; once logged in, the initiator
 * allocates the per-command MRs of the session and deregisters the login
 * MR.
 *
 * rsc_login() posts work requests, but it runs once per connection: the
 * MR allocations it (and its helper) make belong to connection setup, not to
 * the I/O path, and so does the deregistration in rsc_logout() after the
 * queue was drained. The bug: when the login response does not arrive in
 * time, rsc_login() returns -ETIMEDOUT and forgets the login MR it
 * allocated.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define RSC_LOGIN_TIMEOUT_MS	5000
#define RSC_MAX_CMDS		64

struct rsc_login_req {
	__be64	rsp_addr;
	__be32	rsp_rkey;
	__be32	rsp_len;
};

struct rsc_conn {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct scatterlist	login_sg;
	struct ib_mr		*login_mr;
	struct ib_mr		*cmd_mrs[RSC_MAX_CMDS];
	u32			max_pages;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct completion	login_done;
	struct rsc_login_req	*login_req;
	u64			login_req_dma;
};

static int rsc_alloc_cmd_mrs(struct rsc_conn *conn)
{
	int i;

	for (i = 0; i < RSC_MAX_CMDS; i++) {
		/* BUG: rdma-local-mr-management -- the initiator allocates its own MRs */
		conn->cmd_mrs[i] = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
					       conn->max_pages); /* OK: rdma-registration-in-datapath -- session setup after login, once per connection */
		if (IS_ERR(conn->cmd_mrs[i])) {
			int ret = PTR_ERR(conn->cmd_mrs[i]);

			while (--i >= 0)
				/* BUG: rdma-local-mr-management -- the initiator deregisters its MRs */
				ib_dereg_mr(conn->cmd_mrs[i]);
			return ret;
		}
	}
	return 0;
}

static void rsc_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("rsc: login send failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

int rsc_login(struct rsc_conn *conn)
{
	int ret;

	/* BUG: rdma-local-mr-management -- the initiator allocates its own MR */
	conn->login_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- the login runs once per connection */
	if (IS_ERR(conn->login_mr))
		return PTR_ERR(conn->login_mr);
	/* BUG: rdma-local-mr-management -- the initiator maps the login buffer into its MR */
	if (ib_map_mr_sg(conn->login_mr, &conn->login_sg, 1, NULL, SZ_4K) != 1) {
		ret = -EINVAL;
		goto out_dereg;
	}

	memset(&conn->reg_wr, 0, sizeof(conn->reg_wr));
	conn->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the initiator */
	conn->reg_wr.wr.next = &conn->send_wr;
	conn->reg_wr.mr = conn->login_mr; /* OK: rdma-rkey-reuse -- the login MR is registered once and then deregistered */
	conn->reg_wr.key = conn->login_mr->rkey;
	conn->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	conn->login_req->rsp_addr = cpu_to_be64(conn->login_mr->iova);
	conn->login_req->rsp_rkey = cpu_to_be32(conn->login_mr->rkey);
	conn->login_req->rsp_len = cpu_to_be32(conn->login_mr->length);

	conn->send_sge.addr = conn->login_req_dma;
	conn->send_sge.length = sizeof(*conn->login_req);
	conn->send_sge.lkey = conn->pd->local_dma_lkey;
	conn->send_cqe.done = rsc_send_done;
	conn->send_wr.next = NULL;
	conn->send_wr.wr_cqe = &conn->send_cqe;
	conn->send_wr.opcode = IB_WR_SEND;
	conn->send_wr.sg_list = &conn->send_sge;
	conn->send_wr.num_sge = 1;
	conn->send_wr.send_flags = IB_SEND_SIGNALED;

	init_completion(&conn->login_done);
	ret = ib_post_send(conn->qp, &conn->reg_wr.wr, NULL);
	if (ret)
		goto out_dereg;

	if (!wait_for_completion_timeout(&conn->login_done,
					 msecs_to_jiffies(RSC_LOGIN_TIMEOUT_MS)))
		return -ETIMEDOUT; /* BUG: rdma-mr-leak -- the login MR stays allocated (and registered) when the target never answers */

	ret = rsc_alloc_cmd_mrs(conn);
out_dereg:
	/* BUG: rdma-local-mr-management -- the initiator deregisters its MR */
	ib_dereg_mr(conn->login_mr); /* OK: rdma-invalidation-leak -- deregistration kills the login rkey */
	conn->login_mr = NULL;
	return ret;
}

void rsc_logout(struct rsc_conn *conn)
{
	int i;

	ib_drain_qp(conn->qp);
	for (i = 0; i < RSC_MAX_CMDS; i++)
		/* BUG: rdma-local-mr-management -- the initiator deregisters its MRs */
		ib_dereg_mr(conn->cmd_mrs[i]); /* OK: rdma-registration-in-datapath -- teardown after the drain */
}
