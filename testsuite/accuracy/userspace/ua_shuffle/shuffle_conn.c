/*
 * shuffle_conn.c - device selection (InfiniBand/RoCE only), per-connection RC
 * QP with a receive ring registered once, UD QP for heartbeats.  Correct:
 * receive depth and inline size checked against the device.  Bugs: 2 send
 * entries per FETCH for a chain of up to 8 READs, heartbeats never signaled,
 * the unwind after a failed heartbeat QP skips the ring's MR.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include "shuffle.h"

int shuf_dev_open(struct shuf_dev *dev)
{
	struct ibv_device **list;
	int i, n;

	memset(dev, 0, sizeof(*dev));
	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n; i++) {
		if (list[i]->transport_type != IBV_TRANSPORT_IB)
			continue;	/* READ chains assume max_sge_rd > 1 */
		dev->ctx = ibv_open_device(list[i]);
		if (dev->ctx)
			break;
	}
	ibv_free_device_list(list);
	if (!dev->ctx)
		return -ENODEV;
	if (ibv_query_device(dev->ctx, &dev->attr) || !(dev->pd = ibv_alloc_pd(dev->ctx)))
		return -ENODEV;
	return 0;
}

/* allocates *ring and returns its registration */
static struct ibv_mr *shuf_reg_ring(struct ibv_pd *pd, struct shuf_msg **ring, uint32_t n)
{
	struct ibv_mr *mr;

	*ring = calloc(n, sizeof(**ring));
	if (!*ring)
		return NULL;
	mr = ibv_reg_mr(pd, *ring, n * sizeof(**ring), IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- receive ring registered once for local access */
	if (!mr)
		free(*ring);
	return mr;
}

static void shuf_release_ring(struct shuf_conn *conn)
{
	ibv_dereg_mr(conn->rx_mr);
	free(conn->rx);
	conn->rx_mr = NULL;
	conn->rx = NULL;
}

int shuf_conn_create(struct shuf_dev *dev, struct rdma_cm_id *id, struct shuf_conn *conn)
{
	struct ibv_qp_init_attr attr;
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	uint32_t i;

	memset(conn, 0, sizeof(*conn));
	conn->dev = dev;
	conn->id = id;
	conn->rx_depth = SHUF_RECV_DEPTH;
	if (conn->rx_depth > (uint32_t)dev->attr.max_qp_wr)
		conn->rx_depth = dev->attr.max_qp_wr;
	conn->cq = ibv_create_cq(dev->ctx, conn->rx_depth + 2 * SHUF_MAX_INFLIGHT, conn, NULL, 0);
	conn->hb_cq = ibv_create_cq(dev->ctx, 32, conn, NULL, 0);
	if (!conn->cq || !conn->hb_cq)
		goto err_cq;
	conn->rx_mr = shuf_reg_ring(dev->pd, &conn->rx, conn->rx_depth);
	if (!conn->rx_mr)
		goto err_cq;

	attr = (struct ibv_qp_init_attr){ .send_cq = conn->cq, .recv_cq = conn->cq,
		.qp_type = IBV_QPT_RC, .sq_sig_all = 0 };
	/* FETCH (or its READs) and RELEASE */
	/* OK: rdma-send-queue-manual-factor -- the factor covers data work requests; nothing in the program posts registration or invalidation WRs */
	attr.cap.max_send_wr = SHUF_MAX_INFLIGHT * 2; /* BUG(program): rdma-send-queue-undersized -- fetch_issue() posts a chain of up to SHUF_MAX_BLOCKS (8) READs per FETCH, plus the RELEASE SEND */
	attr.cap.max_recv_wr = conn->rx_depth; /* OK: rdma-queue-cap-unchecked -- 4096 is clamped to max_qp_wr above */
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct shuf_msg); /* OK: rdma-queue-cap-unchecked -- the granted inline size is read back below; shuf_send() never exceeds it */
	if (rdma_create_qp(id, dev->pd, &attr))
		goto err_ring;
	conn->qp = id->qp;
	conn->max_inline = attr.cap.max_inline_data;

	attr = (struct ibv_qp_init_attr){ .send_cq = conn->hb_cq, .recv_cq = conn->hb_cq,
		.qp_type = IBV_QPT_UD, .cap = { 16, 16, 1, 1, 64 } };
	attr.sq_sig_all = 0; /* BUG(program): rdma-unsignaled-send-starvation -- shuf_heartbeat() never sets IBV_SEND_SIGNALED; the UD send queue fills after 16 heartbeats */
	conn->hb_qp = ibv_create_qp(dev->pd, &attr);
	if (!conn->hb_qp)
		goto err_qp; /* BUG: rdma-mr-leak -- err_qp jumps past shuf_release_ring(); rx_mr stays registered */

	for (i = 0; i < conn->rx_depth; i++) {
		sge = (struct ibv_sge){ (uintptr_t)&conn->rx[i], sizeof(conn->rx[i]), conn->rx_mr->lkey };
		wr = (struct ibv_recv_wr){ .wr_id = (uintptr_t)&conn->rx[i], .sg_list = &sge, .num_sge = 1 };
		if (ibv_post_recv(conn->qp, &wr, &bad))
			break;
	}
	return 0;

err_ring:
	shuf_release_ring(conn);
	goto err_cq;
err_qp:
	rdma_destroy_qp(id);
err_cq:
	if (conn->hb_cq)
		ibv_destroy_cq(conn->hb_cq);
	if (conn->cq)
		ibv_destroy_cq(conn->cq);
	return -ENOMEM;
}

void shuf_conn_destroy(struct shuf_conn *conn)
{
	ibv_destroy_qp(conn->hb_qp);
	rdma_destroy_qp(conn->id);
	shuf_release_ring(conn); /* OK: rdma-mr-leak -- the helper deregisters the ring */
	ibv_destroy_cq(conn->hb_cq);
	ibv_destroy_cq(conn->cq);
}

int shuf_send(struct shuf_conn *conn, struct shuf_msg *msg, int signaled)
{
	struct ibv_sge sge = { (uintptr_t)msg, sizeof(*msg), 0 };
	struct ibv_send_wr wr = { .wr_id = 0, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;

	if (sge.length > conn->max_inline)
		sge.length = offsetof(struct shuf_msg, blocks) + msg->nblocks * sizeof(msg->blocks[0]);
	if (sge.length > conn->max_inline)
		return -EMSGSIZE;
	wr.send_flags = IBV_SEND_INLINE | (signaled ? IBV_SEND_SIGNALED : 0);
	return ibv_post_send(conn->qp, &wr, &bad);
}

int shuf_heartbeat(struct shuf_conn *conn, struct ibv_ah *ah, uint32_t remote_qpn)
{
	static const uint32_t hb = SHUF_HEARTBEAT;
	struct ibv_sge sge = { (uintptr_t)&hb, sizeof(hb), 0 };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_INLINE }, *bad;

	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = remote_qpn;
	wr.wr.ud.remote_qkey = SHUF_QKEY;
	return ibv_post_send(conn->hb_qp, &wr, &bad);
}
