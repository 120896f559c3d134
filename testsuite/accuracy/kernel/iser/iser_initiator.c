// SPDX-License-Identifier: GPL-2.0
/*
 * isx iser_initiator.c: command send and completion handling (see isx.h).
 *
 * Command SENDs are signaled every ISX_SIGNAL_CMD_COUNT commands through a
 * per-connection counter that is advanced on each send. A response with
 * IB_WC_WITH_INVALIDATE is checked in isx_check_remote_inv(), which hands the
 * invalidated rkey to isx_inv_desc() (iser_memory.c) to compare. Task
 * finalization unregisters (iser_memory.c) and then unmaps the data.
 */
#include "isx.h"

int isx_post_send(struct isx_conn *conn, struct isx_tx_desc *tx_desc,
		  bool has_reg)
{
	struct ib_send_wr *wr = &tx_desc->send_wr;
	struct ib_send_wr *first;

	tx_desc->tx_sg.addr = tx_desc->dma_addr;
	tx_desc->tx_sg.length = 48;
	tx_desc->tx_sg.lkey = conn->device->pd->local_dma_lkey;
	wr->next = NULL;
	wr->wr_cqe = &tx_desc->cqe;
	wr->sg_list = &tx_desc->tx_sg;
	wr->num_sge = 1;
	wr->opcode = IB_WR_SEND;
	/* OK: rdma-unsignaled-send-starvation -- sig_count is incremented on every send */
	wr->send_flags = (++conn->sig_count % ISX_SIGNAL_CMD_COUNT) == 0 ?
			 IB_SEND_SIGNALED : 0;

	if (!has_reg)
		first = wr;
	else if (tx_desc->inv_wr.next)
		first = &tx_desc->inv_wr;
	else
		first = &tx_desc->reg_wr.wr;
	return ib_post_send(conn->qp, first, NULL);
}

int isx_check_remote_inv(struct isx_conn *conn, struct ib_wc *wc,
			 struct isx_hdr *hdr)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey goes to isx_inv_desc(), which compares it with the descriptor's */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		struct isx_task *task = isx_itt_to_task(conn, hdr->itt);
		u32 rkey = wc->ex.invalidate_rkey;

		if (!task)
			return -EINVAL;
		if (hdr->flags & ISX_RSV && task->rdma_reg[ISX_DIR_IN].desc &&
		    isx_inv_desc(task->rdma_reg[ISX_DIR_IN].desc, rkey))
			return -EINVAL;
		if (hdr->flags & ISX_WSV && task->rdma_reg[ISX_DIR_OUT].desc &&
		    isx_inv_desc(task->rdma_reg[ISX_DIR_OUT].desc, rkey))
			return -EINVAL;
	}
	return 0;
}

void isx_task_rdma_finalize(struct isx_task *task)
{
	struct ib_device *ibdev = task->conn->device->ib_device;
	int dir;

	for (dir = ISX_DIR_IN; dir <= ISX_DIR_OUT; dir++) {
		if (!task->dma_nents[dir])
			continue;
		isx_unreg_mem(task, dir);
		ib_dma_unmap_sg(ibdev, task->sg[dir], task->dma_nents[dir],
				dir == ISX_DIR_IN ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
		task->dma_nents[dir] = 0;
	}
}

static void isx_rx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isx_rx_desc *rx = container_of(wc->wr_cqe, struct isx_rx_desc,
					      cqe);
	struct isx_conn *conn = rx->conn;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("isx: rx failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	if (isx_check_remote_inv(conn, wc, rx->hdr)) {
		rdma_disconnect(conn->cma_id);
		return;
	}
	isx_task_rsp(conn, rx->hdr, wc->byte_len);
	ib_post_recv(conn->qp, &rx->wr, NULL);
}

int isx_post_rx(struct isx_conn *conn, struct isx_rx_desc *rx)
{
	rx->conn = conn;
	rx->cqe.done = isx_rx_done;
	rx->sge.addr = rx->dma;
	rx->sge.length = 128;
	rx->sge.lkey = conn->device->pd->local_dma_lkey;
	rx->wr.next = NULL;
	rx->wr.wr_cqe = &rx->cqe;
	rx->wr.sg_list = &rx->sge;
	rx->wr.num_sge = 1;
	return ib_post_recv(conn->qp, &rx->wr, NULL);
}
