/*
 * infiniband.c - device context, chunk pool and queue pairs of the async
 * messenger's RDMA stack.
 *
 * The chunk pool grows by clusters: one allocation, one registration for
 * local access, carved into MSGR_CHUNK_SIZE chunks that carry the
 * cluster's lkey.  Queue pairs are created with only requested work
 * requests signaled, so the TX path chooses when to ask for completions;
 * a signaled beacon is posted when a connection is torn down so that its
 * flush can be observed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma_stack.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

int msgr_ib_open(struct msgr_ib *ib, const char *devname)
{
	struct ibv_device **list;
	int i, n, ret = -ENODEV;

	list = ibv_get_device_list(&n);
	if (!list)
		return -errno;
	for (i = 0; i < n; i++) {
		if (devname && strcmp(ibv_get_device_name(list[i]), devname))
			continue;
		ib->ctx = ibv_open_device(list[i]);
		break;
	}
	ibv_free_device_list(list);
	if (!ib->ctx)
		return ret;

	if (ibv_query_device(ib->ctx, &ib->dev_attr)) {
		ret = -errno;
		goto err_ctx;
	}
	ib->pd = ibv_alloc_pd(ib->ctx);
	if (!ib->pd)
		goto err_ctx;
	ib->chan = ibv_create_comp_channel(ib->ctx);
	if (!ib->chan)
		goto err_pd;
	ib->tx_cq = ibv_create_cq(ib->ctx, MSGR_TX_QUEUE_LEN, ib, ib->chan, 0);
	ib->rx_cq = ibv_create_cq(ib->ctx, MSGR_RX_QUEUE_LEN, ib, ib->chan, 0);
	if (!ib->tx_cq || !ib->rx_cq)
		goto err_cq;

	memset(&ib->pool, 0, sizeof(ib->pool));
	ib->pool.pd = ib->pd;
	ret = msgr_pool_add_cluster(&ib->pool, MSGR_RX_QUEUE_LEN + MSGR_TX_QUEUE_LEN / MSGR_MAX_SGE);
	if (ret)
		goto err_cq;
	return 0;

err_cq:
	if (ib->tx_cq)
		ibv_destroy_cq(ib->tx_cq);
	if (ib->rx_cq)
		ibv_destroy_cq(ib->rx_cq);
	ibv_destroy_comp_channel(ib->chan);
err_pd:
	ibv_dealloc_pd(ib->pd);
err_ctx:
	ibv_close_device(ib->ctx);
	return ret ? ret : -ENOMEM;
}

int msgr_pool_add_cluster(struct msgr_pool *p, unsigned int nchunks)
{
	size_t bytes = (size_t)nchunks * MSGR_CHUNK_SIZE;
	struct msgr_cluster *cl;
	struct ibv_mr *mr;
	char *base;
	unsigned int i;

	base = aligned_alloc(4096, bytes);
	if (!base)
		return -ENOMEM;
	/* OK: rdma-local-mr-management -- message chunks, registered once per cluster for local access */
	mr = ibv_reg_mr(p->pd, base, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		fprintf(stderr, "msgr: failed to register %zu bytes: %s\n", bytes, strerror(errno));
		free(base);
		return -errno;
	}

	cl = calloc(1, sizeof(*cl) + nchunks * sizeof(struct msgr_chunk));
	if (!cl) {
		free(base);		/* OK: rdma-invalidation-leak -- a local-only registration; no key was handed out */
		return -ENOMEM;		// BUG: rdma-mr-leak -- mr is neither deregistered nor stored on this return
	}
	cl->base = base;
	cl->mr = mr;
	cl->nchunks = nchunks;
	for (i = 0; i < nchunks; i++) {
		struct msgr_chunk *c = &cl->chunks[i];

		c->buf = base + (size_t)i * MSGR_CHUNK_SIZE;
		c->lkey = mr->lkey;
		c->next = p->free;
		p->free = c;
		p->nfree++;
	}
	cl->next = p->clusters;
	p->clusters = cl;
	return 0;
}

struct msgr_chunk *msgr_pool_get(struct msgr_pool *p)
{
	struct msgr_chunk *c = p->free;

	if (c) {
		p->free = c->next;
		p->nfree--;
		c->bound = 0;
	}
	return c;
}

void msgr_pool_put(struct msgr_pool *p, struct msgr_chunk *c)
{
	c->next = p->free;
	p->free = c;
	p->nfree++;
}

void msgr_pool_destroy(struct msgr_pool *p)
{
	struct msgr_cluster *cl;

	while ((cl = p->clusters)) {
		p->clusters = cl->next;
		/* OK: rdma-mr-leak -- the cluster's MR is released before the cluster is freed */
		ibv_dereg_mr(cl->mr);
		free(cl->base);
		free(cl);
	}
	p->free = NULL;
	p->nfree = 0;
}

int msgr_ib_create_qp(struct msgr_ib *ib, struct msgr_conn *conn)
{
	struct ibv_qp_init_attr qpa;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = ib->tx_cq;
	qpa.recv_cq = ib->rx_cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.sq_sig_all = 0;		/* only generate CQEs on requested WQEs */
	qpa.cap.max_send_wr = MSGR_TX_QUEUE_LEN;	// BUG: rdma-queue-cap-unchecked -- 4096 send WRs; max_qp_wr is queried at open but never compared
	qpa.cap.max_recv_wr = MSGR_RX_QUEUE_LEN;	/* OK: rdma-queue-cap-unchecked -- 1024 receives, within what every device offers */
	/* OK: rdma-queue-cap-unchecked -- the gather list is clamped to the device's max_sge */
	qpa.cap.max_send_sge = MIN(MSGR_MAX_SGE, ib->dev_attr.max_sge);
	qpa.cap.max_recv_sge = 1;

	conn->qp = ibv_create_qp(ib->pd, &qpa);
	if (!conn->qp) {
		fprintf(stderr, "msgr: failed to create queue pair: %s (try reducing ms_async_rdma_send_buffers)\n",
			strerror(errno));
		return -errno;
	}
	conn->ib = ib;
	conn->max_sge = qpa.cap.max_send_sge;
	/* OK: rdma-send-queue-undersized -- posts are gated by credits counted in work requests */
	conn->tx_credits = MSGR_TX_QUEUE_LEN;
	conn->unsignaled = 0;
	conn->closing = 0;
	return 0;
}

/*
 * Last work request of a connection: once its completion (flush error)
 * shows up on the TX CQ, every earlier one has been retired too.
 */
int msgr_ib_post_beacon(struct msgr_conn *conn)
{
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.wr_id = (uintptr_t)conn;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	conn->closing = 1;
	return ibv_post_send(conn->qp, &wr, &bad);
}
