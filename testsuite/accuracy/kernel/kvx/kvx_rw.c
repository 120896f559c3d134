// SPDX-License-Identifier: GPL-2.0
/*
 * kvx_rw.c - value transfer of the KVX key-value server.
 *
 * GET pushes the value into the client's buffer with an RDMA WRITE and
 * chains the response SEND behind it; PUT pulls the value with an RDMA
 * READ and answers once it has been stored.  Both use rdma_rw contexts.
 */
#include "kvx.h"

static void kvx_rsp_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvx_req *req = container_of(wc->wr_cqe, struct kvx_req, rsp_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("kvx: response failed: %s\n", ib_wc_status_msg(wc->status));
	kvx_req_put(req);
}

static void kvx_build_rsp(struct kvx_req *req, u64 dma, u32 len)
{
	req->rsp_sge.addr = dma;
	req->rsp_sge.length = len;
	req->rsp_sge.lkey = req->conn->srv->pd->local_dma_lkey;
	req->rsp_cqe.done = kvx_rsp_done;
	req->rsp_wr.next = NULL;
	req->rsp_wr.wr_cqe = &req->rsp_cqe;
	req->rsp_wr.sg_list = &req->rsp_sge;
	req->rsp_wr.num_sge = 1;
	req->rsp_wr.opcode = IB_WR_SEND;
	/* OK: rdma-unsignaled-send-starvation -- every response is signaled; it also retires the rdma_rw chain in front of it */
	req->rsp_wr.send_flags = IB_SEND_SIGNALED;
}

int kvx_get_value(struct kvx_req *req, u64 rsp_dma, u32 rsp_len)
{
	struct kvx_conn *conn = req->conn;
	int ret;

	/* OK: rdma-local-mr-management -- the core maps the value and decides about MRs */
	ret = rdma_rw_ctx_init(&req->rw, conn->qp, conn->port_num, req->sg,
			       req->sg_cnt, 0, req->remote_addr, req->remote_key,
			       DMA_TO_DEVICE);
	if (ret < 0)
		return ret;
	req->rw_live = true;
	req->dir = DMA_TO_DEVICE;

	kvx_build_rsp(req, rsp_dma, rsp_len);
	atomic_inc(&req->ref);
	ret = rdma_rw_ctx_post(&req->rw, conn->qp, conn->port_num, NULL,
			       &req->rsp_wr);
	if (ret) {
		rdma_rw_ctx_destroy(&req->rw, conn->qp, conn->port_num, req->sg,
				    req->sg_cnt, DMA_TO_DEVICE);
		req->rw_live = false;
		atomic_dec(&req->ref);
	}
	return ret;
}

static void kvx_put_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvx_req *req = container_of(wc->wr_cqe, struct kvx_req, rw_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("kvx: value READ failed: %s\n", ib_wc_status_msg(wc->status));
	kvx_req_put(req);
}

int kvx_put_value(struct kvx_req *req)
{
	struct kvx_conn *conn = req->conn;
	int ret;

	/* OK: rdma-access-flags-transport, rdma-local-mr-management -- rdma_rw builds the READ and gives an iWARP sink remote write itself */
	ret = rdma_rw_ctx_init(&req->rw, conn->qp, conn->port_num, req->sg,
			       req->sg_cnt, 0, req->remote_addr, req->remote_key,
			       DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	req->rw_live = true;
	req->dir = DMA_FROM_DEVICE;
	req->rw_cqe.done = kvx_put_done;
	atomic_inc(&req->ref);
	ret = rdma_rw_ctx_post(&req->rw, conn->qp, conn->port_num,
			       &req->rw_cqe, NULL);
	if (ret)
		atomic_dec(&req->ref);
	return ret;
}
