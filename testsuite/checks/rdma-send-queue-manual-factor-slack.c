// RUN: %check_ulplint --kernel %s rdma-send-queue-manual-factor %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-send-queue-manual-factor %t.plugin

// An iSER-style initiator: each command keeps a LOCAL_INV, a REG_MR and a
// SEND outstanding, plus a few miscellaneous PDUs and the drain entry,
// added once through named constants. The factor is the command count's;
// the named slack does not hide it. No fix-it: rewriting the sum would
// drop the slack the ULP counted.

#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define IX_WRS_PER_CMD 3 /* LOCAL_INV + REG_MR + SEND */
#define IX_MAX_TX_MISC_PDUS 6
#define IX_MAX_RX_MISC_PDUS 4

struct ix_conn {
	struct rdma_cm_id	*cma_id;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			cmds_max;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
};

int ix_create_qp(struct ix_conn *conn, struct ib_device *ibdev)
{
	struct ib_qp_init_attr init_attr;
	u32 misc = IX_MAX_TX_MISC_PDUS + 1;

	if (IX_WRS_PER_CMD * conn->cmds_max + misc > ibdev->attrs.max_qp_wr)
		conn->cmds_max = (ibdev->attrs.max_qp_wr - misc) / IX_WRS_PER_CMD;
	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.send_cq = conn->cq;
	init_attr.recv_cq = conn->cq;
	init_attr.cap.max_send_wr = IX_WRS_PER_CMD * conn->cmds_max + misc;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: max_send_wr multiplies the queue depth 'conn->cmds_max' by a hand-made factor '3' for registration and invalidation work requests; let the core size it: set cap.max_rdma_ctxs and register through rdma_rw_ctx_*() (rdma_rw_init_qp() adds the registration WRs per context) [rdma-send-queue-manual-factor]
	// CHECK-MESSAGES: :[[@LINE-2]]:2: note: size the queue through cap.max_rdma_ctxs
	init_attr.cap.max_recv_wr = conn->cmds_max + IX_MAX_RX_MISC_PDUS;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.qp_type = IB_QPT_RC;
	return rdma_create_qp(conn->cma_id, conn->pd, &init_attr);
}

/* Near miss: one SEND per command plus named slack, no factor. */
int ix_create_ctrl_qp(struct ix_conn *conn)
{
	struct ib_qp_init_attr init_attr;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.send_cq = conn->cq;
	init_attr.recv_cq = conn->cq;
	init_attr.cap.max_send_wr = conn->cmds_max + IX_MAX_TX_MISC_PDUS + 1;
	init_attr.cap.max_recv_wr = conn->cmds_max + IX_MAX_RX_MISC_PDUS;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.qp_type = IB_QPT_RC;
	return rdma_create_qp(conn->cma_id, conn->pd, &init_attr);
}

int ix_post_reg(struct ix_conn *conn)
{
	memset(&conn->reg_wr, 0, sizeof(conn->reg_wr));
	conn->reg_wr.wr.opcode = IB_WR_REG_MR;
	conn->reg_wr.mr = conn->mr;
	conn->reg_wr.key = conn->mr->rkey;
	conn->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	return ib_post_send(conn->qp, &conn->reg_wr.wr, NULL);
}
