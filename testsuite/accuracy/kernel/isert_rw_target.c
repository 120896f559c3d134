// SPDX-License-Identifier: GPL-2.0
/*
 * isrt: connection setup and data transfer of an iSER-target-style ULP
 * (modelled on drivers/infiniband/ulp/isert/ib_isert.c, written fresh) for
 * a configuration with deep command queues (2048 commands).
 *
 * Data-Out is pulled and Data-In pushed with rdma_rw; the QP declares one
 * context per command, so rdma_rw_init_qp() adds the registration WRs and
 * clamps max_send_wr to the device's max_qp_wr: the 2049-entry send queue
 * constant is safe. The receive queue gets no such clamp, and 2049 receive
 * WRs are requested without looking at attrs.max_qp_wr. Responses are
 * signaled SENDs; the target registers nothing itself.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

#define ISRT_CMDS_MAX		2048
#define ISRT_QP_MAX_REQ_DTOS	(ISRT_CMDS_MAX + 1)
#define ISRT_QP_MAX_RECV_DTOS	(ISRT_CMDS_MAX + 1)

struct isrt_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
};

struct isrt_cmd {
	struct isrt_conn	*conn;
	struct rdma_rw_ctx	rw;
	struct ib_cqe		tx_cqe;
	struct ib_cqe		rw_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		tx_sge;
	struct scatterlist	*sgl;
	u32			nents;
	enum dma_data_direction	dir;
	u64			rsp_dma;
	u32			rsp_len;
};

void isrt_put_cmd(struct isrt_cmd *cmd);
void isrt_execute_write(struct isrt_cmd *cmd);

int isrt_create_qp(struct isrt_conn *conn)
{
	struct ib_device *ibdev = conn->cm_id->device;
	struct ib_qp_init_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.event_handler = NULL;
	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	attr.cap.max_send_wr = ISRT_QP_MAX_REQ_DTOS; /* OK: rdma-queue-cap-unchecked -- the QP declares max_rdma_ctxs, so rdma_rw_init_qp() clamps max_send_wr to max_qp_wr */
	attr.cap.max_recv_wr = ISRT_QP_MAX_RECV_DTOS; /* BUG: rdma-queue-cap-unchecked -- 2049 receive WRs, never compared with attrs.max_qp_wr */
	attr.cap.max_rdma_ctxs = ISRT_CMDS_MAX;
	attr.cap.max_send_sge = ibdev->attrs.max_send_sge;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- responses are signaled and rdma_rw signals contexts posted with a cqe */
	attr.qp_type = IB_QPT_RC;
	attr.port_num = conn->cm_id->port_num;

	ret = rdma_create_qp(conn->cm_id, conn->pd, &attr);
	if (ret) {
		pr_err("isrt: rdma_create_qp failed: %d\n", ret);
		return ret;
	}
	conn->qp = conn->cm_id->qp;
	return 0;
}

static void isrt_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isrt_cmd *cmd = container_of(wc->wr_cqe, struct isrt_cmd, rw_cqe);
	struct isrt_conn *conn = cmd->conn;

	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the core's context, destroyed after its READs completed */
	rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->cm_id->port_num,
			    cmd->sgl, cmd->nents, cmd->dir);
	cmd->nents = 0;
	if (wc->status != IB_WC_SUCCESS) {
		isrt_put_cmd(cmd);
		return;
	}
	isrt_execute_write(cmd);
}

int isrt_get_dataout(struct isrt_cmd *cmd, u64 va, u32 rkey)
{
	struct isrt_conn *conn = cmd->conn;
	int ret;

	cmd->dir = DMA_FROM_DEVICE;
	/* OK: rdma-access-flags-transport, rdma-local-mr-management -- rdma_rw builds the READ and registers its sink as the transport requires */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->cm_id->port_num,
			       cmd->sgl, cmd->nents, 0, va, rkey, cmd->dir);
	if (ret < 0)
		return ret;
	cmd->rw_cqe.done = isrt_rdma_read_done;
	return rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->cm_id->port_num,
				&cmd->rw_cqe, NULL);
}

static void isrt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isrt_cmd *cmd = container_of(wc->wr_cqe, struct isrt_cmd, tx_cqe);
	struct isrt_conn *conn = cmd->conn;

	if (cmd->nents) {
		rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->cm_id->port_num,
				    cmd->sgl, cmd->nents, cmd->dir);
		cmd->nents = 0;
	}
	isrt_put_cmd(cmd);
}

int isrt_put_datain(struct isrt_cmd *cmd, u64 va, u32 rkey)
{
	struct isrt_conn *conn = cmd->conn;
	struct ib_send_wr *first;
	int ret;

	cmd->tx_sge.addr = cmd->rsp_dma;
	cmd->tx_sge.length = cmd->rsp_len;
	cmd->tx_sge.lkey = conn->pd->local_dma_lkey;
	cmd->tx_cqe.done = isrt_send_done;
	cmd->send_wr.next = NULL;
	cmd->send_wr.wr_cqe = &cmd->tx_cqe;
	cmd->send_wr.sg_list = &cmd->tx_sge;
	cmd->send_wr.num_sge = 1;
	cmd->send_wr.opcode = IB_WR_SEND;
	cmd->send_wr.send_flags = IB_SEND_SIGNALED;

	cmd->dir = DMA_TO_DEVICE;
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->cm_id->port_num,
			       cmd->sgl, cmd->nents, 0, va, rkey, cmd->dir);
	if (ret < 0)
		return ret;
	first = rdma_rw_ctx_wrs(&cmd->rw, conn->qp, conn->cm_id->port_num,
				NULL, &cmd->send_wr);
	return ib_post_send(conn->qp, first, NULL);
}
