// SPDX-License-Identifier: GPL-2.0
/*
 * objd_rw.c: data movement (see objd.h).
 *
 * Object payloads move with rdma_rw in both directions, and the contexts
 * are destroyed from their completions. But before a PUT, the target pulls
 * the client's small metadata descriptor with an RDMA READ of its own into a
 * kmalloc'ed buffer addressed with the PD's local_dma_lkey; the target does
 * not refuse iWARP devices, where that READ sink would need REMOTE_WRITE.
 */
#include "objd.h"

static void objd_rw_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct objd_cmd *cmd = container_of(wc->wr_cqe, struct objd_cmd, rw_cqe);
	struct objd_conn *conn = cmd->conn;

	/* OK: rdma-invalidation-leak -- rdma_rw's context, destroyed after its transfer completed */
	rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->cm_id->port_num,
			    cmd->sgl, cmd->nents, cmd->dir);
	if (wc->status != IB_WC_SUCCESS) {
		objd_free_cmd(cmd);
		return;
	}
	if (cmd->dir == DMA_FROM_DEVICE)
		objd_store_object(cmd);
	else
		objd_free_cmd(cmd);
}

static void objd_meta_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct objd_cmd *cmd = container_of(wc->wr_cqe, struct objd_cmd,
					    meta_cqe);

	if (wc->status != IB_WC_SUCCESS)
		objd_free_cmd(cmd);
}

int objd_fetch_meta(struct objd_cmd *cmd, u64 raddr, u32 rkey)
{
	struct objd_conn *conn = cmd->conn;

	cmd->meta_sge.addr = cmd->meta_dma;
	cmd->meta_sge.length = OBJD_META_SIZE;
	cmd->meta_sge.lkey = conn->pd->local_dma_lkey;
	cmd->meta_cqe.done = objd_meta_done;
	cmd->meta_wr.wr.next = NULL;
	cmd->meta_wr.wr.wr_cqe = &cmd->meta_cqe;
	cmd->meta_wr.wr.opcode = IB_WR_RDMA_READ;
	cmd->meta_wr.wr.sg_list = &cmd->meta_sge;
	cmd->meta_wr.wr.num_sge = 1;
	cmd->meta_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmd->meta_wr.remote_addr = raddr;
	cmd->meta_wr.rkey = rkey;
	/* BUG: rdma-access-flags-transport -- the READ's sink is local_dma_lkey memory, which cannot have the REMOTE_WRITE an iWARP READ sink needs */
	return ib_post_send(conn->qp, &cmd->meta_wr.wr, NULL);
}

int objd_pull_payload(struct objd_cmd *cmd, u64 raddr, u32 rkey)
{
	struct objd_conn *conn = cmd->conn;
	int ret;

	cmd->dir = DMA_FROM_DEVICE;
	/* OK: rdma-local-mr-management, rdma-access-flags-transport -- the payload READ is built and registered by rdma_rw */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->cm_id->port_num,
			       cmd->sgl, cmd->nents, 0, raddr, rkey, cmd->dir);
	if (ret < 0)
		return ret;
	cmd->rw_cqe.done = objd_rw_done;
	return rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->cm_id->port_num,
				&cmd->rw_cqe, NULL);
}

int objd_push_payload(struct objd_cmd *cmd, u64 raddr, u32 rkey)
{
	struct objd_conn *conn = cmd->conn;
	int ret;

	cmd->dir = DMA_TO_DEVICE;
	/* OK: rdma-local-mr-management -- rdma_rw builds the WRITEs */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->cm_id->port_num,
			       cmd->sgl, cmd->nents, 0, raddr, rkey, cmd->dir);
	if (ret < 0)
		return ret;
	cmd->rw_cqe.done = objd_rw_done;
	return rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->cm_id->port_num,
				&cmd->rw_cqe, NULL);
}

int objd_send_rsp(struct objd_cmd *cmd, u32 len)
{
	struct objd_conn *conn = cmd->conn;

	cmd->rsp_sge.addr = cmd->rsp_dma;
	cmd->rsp_sge.length = len;
	cmd->rsp_sge.lkey = conn->pd->local_dma_lkey;
	cmd->rsp_wr.next = NULL;
	cmd->rsp_wr.wr_cqe = &cmd->rsp_cqe;
	cmd->rsp_wr.opcode = IB_WR_SEND;
	cmd->rsp_wr.sg_list = &cmd->rsp_sge;
	cmd->rsp_wr.num_sge = 1;
	cmd->rsp_wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(conn->qp, &cmd->rsp_wr, NULL);
}
