// SPDX-License-Identifier: GPL-2.0
/*
 * kvx_main.c - connections and requests of the KVX key-value server.
 *
 * Values move with the core's rdma_rw contexts (kvx_rw.c), so the send
 * queue is sized through max_rdma_ctxs.  Clients look keys up with
 * one-sided READs of the index region (kvx_index.c); the index key is
 * handed out when they connect and re-sent when the index is resized.
 * Requests are reference counted and torn down by their release callback.
 */
#include <linux/string.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include "kvx.h"

static void kvx_req_release(struct kvx_req *req)
{
	struct kvx_conn *conn = req->conn;

	if (req->rw_live)
		rdma_rw_ctx_destroy(&req->rw, conn->qp, conn->port_num,
				    req->sg, req->sg_cnt, req->dir);
	kfree(req->sg);
	kfree(req);
}

void kvx_req_put(struct kvx_req *req)
{
	if (atomic_dec_and_test(&req->ref))
		req->release(req);
}

struct kvx_req *kvx_req_alloc(struct kvx_conn *conn)
{
	struct kvx_req *req = kzalloc(sizeof(*req), GFP_KERNEL);

	if (!req)
		return NULL;
	req->conn = conn;
	req->release = kvx_req_release;
	atomic_set(&req->ref, 1);
	return req;
}

int kvx_conn_create(struct kvx_conn *conn)
{
	struct kvx_server *srv = conn->srv;
	struct ib_device *dev = srv->dev;
	struct ib_qp_init_attr attr;
	int ret;

	conn->cq = ib_cq_pool_get(dev, 2 * KVX_MAX_REQS + KVX_CTRL_WRS + 1, -1,
				  IB_POLL_WORKQUEUE);
	if (IS_ERR(conn->cq))
		return PTR_ERR(conn->cq);

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- one response per request, the index work requests and the drain; rdma_rw grows the queue for its own READ/WRITE/MR work requests */
	attr.cap.max_send_wr = KVX_MAX_REQS + KVX_CTRL_WRS + 1;
	attr.cap.max_rdma_ctxs = KVX_MAX_REQS *
		rdma_rw_mr_factor(dev, conn->port_num, KVX_MAX_VALUE_PAGES);
	attr.cap.max_recv_wr = KVX_MAX_REQS;
	/* BUG(file): rdma-queue-cap-unchecked -- sixteen send SGEs requested without comparing with attrs.max_send_sge */
	attr.cap.max_send_sge = KVX_MAX_SGE;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = KVX_INLINE; /* OK: rdma-queue-cap-unchecked -- 64 bytes of inline data is within every device's limit */
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.port_num = conn->port_num;

	ret = rdma_create_qp(conn->cm_id, srv->pd, &attr);
	if (ret) {
		ib_cq_pool_put(conn->cq, 2 * KVX_MAX_REQS + KVX_CTRL_WRS + 1);
		return ret;
	}
	conn->qp = conn->cm_id->qp;
	return 0;
}

void kvx_build_accept(struct kvx_conn *conn, struct kvx_accept_msg *msg)
{
	struct kvx_index *idx = &conn->srv->index;

	mutex_lock(&idx->lock);
	msg->version = cpu_to_le32(1);
	msg->index_rkey = cpu_to_le32(idx->mr->rkey);
	msg->index_addr = cpu_to_le64(idx->mr->iova);
	msg->index_len = cpu_to_le32(idx->mr->length);
	mutex_unlock(&idx->lock);
}

void kvx_conn_destroy(struct kvx_conn *conn)
{
	ib_drain_qp(conn->qp);
	rdma_destroy_qp(conn->cm_id);
	ib_cq_pool_put(conn->cq, 2 * KVX_MAX_REQS + KVX_CTRL_WRS + 1);
}

int kvx_server_init(struct kvx_server *srv, struct kvx_conn *first)
{
	int ret;

	srv->pd = ib_alloc_pd(srv->dev, 0);
	if (IS_ERR(srv->pd))
		return PTR_ERR(srv->pd);
	ret = kvx_index_init(srv, first);
	if (ret)
		ib_dealloc_pd(srv->pd);
	return ret;
}
