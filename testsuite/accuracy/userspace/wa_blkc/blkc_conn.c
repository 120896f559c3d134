/*
 * blkc_conn.c - connection setup and teardown for the blkc client.
 *
 * Correct: the window allocation unwinding, teardown that deallocates the
 * windows before the slab goes. Not correct: a QP creation failure returns
 * with the receive ring still registered.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "blkc.h"

uint64_t blkc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int blkc_reqs_init(struct blkc_conn *c)
{
	struct blkc_req *req;
	int i;

	c->free_list = NULL;
	for (i = 0; i < BLKC_QUEUE_DEPTH; i++) {
		req = &c->reqs[i];
		memset(req, 0, sizeof(*req));
		req->conn  = c;
		req->state = BLKC_REQ_FREE;
		req->slot  = (char *)c->slab + (size_t)i * BLKC_SLOT_SIZE;
		req->cmd   = (struct blkc_cmd *)c->cmd_ring + i;

		req->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- per-request window that hands a slot to the server
		if (!req->mw)
			goto unwind;
		req->rkey = req->mw->rkey;

		req->next    = c->free_list;
		c->free_list = req;
	}
	return 0;

unwind:
	while (i--)
		ibv_dealloc_mw(c->reqs[i].mw);
	c->free_list = NULL;
	return -ENOMEM; // OK: rdma-mr-leak -- the failing slot holds no window; while (i--) releases all earlier ones
}

static int blkc_post_recvs(struct blkc_conn *c)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	int i;

	for (i = 0; i < BLKC_QUEUE_DEPTH; i++) {
		sge.addr   = (uintptr_t)c->rx_ring + (size_t)i * BLKC_RX_MSG_SIZE;
		sge.length = BLKC_RX_MSG_SIZE;
		sge.lkey   = c->rx_mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id   = (uint64_t)i << 2;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		if (ibv_post_recv(c->qp, &wr, &bad))
			return -EIO;
	}
	return 0;
}

int blkc_conn_setup(struct blkc_conn *c, struct ibv_context *ctx)
{
	struct ibv_qp_init_attr qpa;
	size_t slab_len = (size_t)BLKC_QUEUE_DEPTH * BLKC_SLOT_SIZE;

	c->ctx = ctx;
	c->pd  = ibv_alloc_pd(ctx);
	if (!c->pd)
		return -ENODEV;
	c->cq = ibv_create_cq(ctx, 4 * BLKC_QUEUE_DEPTH, NULL, NULL, 0);
	if (!c->cq)
		goto err_pd;

	c->rx_ring = calloc(BLKC_QUEUE_DEPTH, BLKC_RX_MSG_SIZE);
	if (!c->rx_ring)
		goto err_cq;
	c->rx_mr = ibv_reg_mr(c->pd, c->rx_ring, BLKC_QUEUE_DEPTH * BLKC_RX_MSG_SIZE,
			      IBV_ACCESS_LOCAL_WRITE); // OK: rdma-local-mr-management -- response ring, registered once for local access
	if (!c->rx_mr)
		goto err_rx;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq          = c->cq;
	qpa.recv_cq          = c->cq;
	qpa.qp_type          = IBV_QPT_RC;
	qpa.cap.max_send_wr  = 4 * BLKC_QUEUE_DEPTH;
	qpa.cap.max_recv_wr  = BLKC_QUEUE_DEPTH;
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &qpa);
	if (!c->qp) {
		blkc_log("ibv_create_qp: %s", strerror(errno));
		return -errno; // BUG: rdma-mr-leak -- c->rx_mr stays registered; this exit skips err_rx_mr
	}

	c->cmd_ring = calloc(BLKC_QUEUE_DEPTH, sizeof(struct blkc_cmd));
	if (!c->cmd_ring)
		goto err_qp;
	c->cmd_mr = ibv_reg_mr(c->pd, c->cmd_ring,
			       BLKC_QUEUE_DEPTH * sizeof(struct blkc_cmd), 0); // OK: rdma-local-mr-management -- command SEND buffers, registered once, local only
	if (!c->cmd_mr)
		goto err_cmd;

	c->slab = aligned_alloc(4096, slab_len);
	if (!c->slab)
		goto err_cmd_mr;
	c->slab_mr = ibv_reg_mr(c->pd, c->slab, slab_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND); // BUG: rdma-local-mr-management -- windows expose its slots to the server and its lkey sources the client's RDMA WRITEs
	if (!c->slab_mr)
		goto err_slab;

	if (blkc_reqs_init(c))
		goto err_slab_mr;
	if (blkc_post_recvs(c))
		goto err_reqs;

	pthread_mutex_init(&c->lock, NULL);
	c->stopping = 0;
	if (pthread_create(&c->reaper, NULL, blkc_reaper_main, c)) {
		pthread_mutex_destroy(&c->lock);
		goto err_reqs;
	}
	return 0;

err_reqs:
	for (int i = 0; i < BLKC_QUEUE_DEPTH; i++)
		ibv_dealloc_mw(c->reqs[i].mw);
err_slab_mr:
	ibv_dereg_mr(c->slab_mr);
err_slab:
	free(c->slab);
err_cmd_mr:
	ibv_dereg_mr(c->cmd_mr);
err_cmd:
	free(c->cmd_ring);
err_qp:
	ibv_destroy_qp(c->qp);
	ibv_dereg_mr(c->rx_mr);
err_rx:
	free(c->rx_ring);
err_cq:
	ibv_destroy_cq(c->cq);
err_pd:
	ibv_dealloc_pd(c->pd);
	return -ENOMEM;
}

void blkc_conn_destroy(struct blkc_conn *c)
{
	int i;

	c->stopping = 1;
	pthread_join(c->reaper, NULL);

	if (blkc_drain(c))
		blkc_log("drain incomplete, windows are deallocated below");

	for (i = 0; i < BLKC_QUEUE_DEPTH; i++) {
		if (c->reqs[i].big_mr) {
			ibv_dereg_mr(c->reqs[i].big_mr);
			c->reqs[i].big_mr = NULL;
		}
		ibv_dealloc_mw(c->reqs[i].mw);
		c->reqs[i].mw = NULL;
	}
	ibv_dereg_mr(c->slab_mr);
	free(c->slab); // OK: rdma-invalidation-leak -- every window over the slab was deallocated above

	ibv_destroy_qp(c->qp);
	free(c->cmd_ring); // OK: rdma-invalidation-leak -- local-only registration, no key handed out
	ibv_dereg_mr(c->cmd_mr);
	ibv_dereg_mr(c->rx_mr);
	free(c->rx_ring);
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->pd);
	pthread_mutex_destroy(&c->lock);
}
