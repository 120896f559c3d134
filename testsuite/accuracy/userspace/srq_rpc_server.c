/*
 * srqd: an RPC server where every client connection has its own RC QP but
 * all receives come from one shared receive queue.  Replies are SENDs
 * from a reply pool registered once.  The SRQ is sized from the device's
 * max_srq_wr; per-connection send queues hold the replies in flight for
 * that client.
 *
 * Correct: the SRQ depth is clamped to the device; every reply is
 * signaled and its completion returns the reply buffer to the pool.
 * Not correct: the per-connection send queue was raised to 2048 entries
 * for a benchmark and never compared with max_qp_wr -- QP creation fails
 * on adapters that allow fewer work requests (and on rxe/siw setups).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SRQD_WANT_SRQ_WR	8192
#define SRQD_CONN_SEND_WR	2048
#define SRQD_MSG		1024

struct srqd_reply {
	struct srqd_reply *next;
	char               buf[SRQD_MSG];
};

struct srqd {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_srq     *srq;
	char               *rx;
	unsigned int        rx_count;
	struct ibv_mr      *rx_mr;
	struct srqd_reply  *replies;
	struct srqd_reply  *free_replies;
	struct ibv_mr      *reply_mr;
};

int srqd_setup(struct srqd *d, unsigned int nreplies)
{
	struct ibv_device_attr attr;
	struct ibv_srq_init_attr sattr;
	unsigned int i;

	if (ibv_query_device(d->ctx, &attr))
		return -errno;
	d->rx_count = SRQD_WANT_SRQ_WR;
	if (d->rx_count > (unsigned int)attr.max_srq_wr)
		d->rx_count = attr.max_srq_wr;

	memset(&sattr, 0, sizeof(sattr));
	sattr.attr.max_wr = d->rx_count;
	sattr.attr.max_sge = 1;
	d->srq = ibv_create_srq(d->pd, &sattr);
	if (!d->srq)
		return -errno;

	d->rx = calloc(d->rx_count, SRQD_MSG);
	d->replies = calloc(nreplies, sizeof(*d->replies));
	if (!d->rx || !d->replies)
		goto err;
	/* OK: rdma-local-mr-management -- receive ring registered once for local access */
	d->rx_mr = ibv_reg_mr(d->pd, d->rx, (size_t)d->rx_count * SRQD_MSG, IBV_ACCESS_LOCAL_WRITE);
	if (!d->rx_mr)
		goto err;
	/* OK: rdma-local-mr-management -- reply pool registered once, SEND source only */
	d->reply_mr = ibv_reg_mr(d->pd, d->replies, nreplies * sizeof(*d->replies), 0);
	if (!d->reply_mr)
		goto err_rx_mr;
	for (i = 0; i < nreplies; i++) {
		d->replies[i].next = d->free_replies;
		d->free_replies = &d->replies[i];
	}
	for (i = 0; i < d->rx_count; i++) {
		struct ibv_sge sge = { (uintptr_t)(d->rx + (size_t)i * SRQD_MSG), SRQD_MSG,
				       d->rx_mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_srq_recv(d->srq, &wr, &bad))
			goto err_reply_mr;
	}
	return 0;

err_reply_mr:
	ibv_dereg_mr(d->reply_mr);
err_rx_mr:
	ibv_dereg_mr(d->rx_mr);
err:
	free(d->rx);
	free(d->replies);
	ibv_destroy_srq(d->srq);
	return -ENOMEM;
}

struct ibv_qp *srqd_conn_qp(struct srqd *d)
{
	struct ibv_qp_init_attr qpa = {
		.send_cq = d->cq,
		.recv_cq = d->cq,
		.srq = d->srq,
		.qp_type = IBV_QPT_RC,
	};

	qpa.cap.max_send_wr = SRQD_CONN_SEND_WR; // BUG: rdma-queue-cap-unchecked -- 2048 send WRs without comparing with max_qp_wr
	qpa.cap.max_send_sge = 1;
	return ibv_create_qp(d->pd, &qpa);
}

int srqd_reply(struct srqd *d, struct ibv_qp *qp, const void *msg, uint32_t len)
{
	struct srqd_reply *r = d->free_replies;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (!r)
		return -EAGAIN;
	if (len > SRQD_MSG)
		return -EMSGSIZE;
	d->free_replies = r->next;
	memcpy(r->buf, msg, len);
	sge.addr = (uintptr_t)r->buf;
	sge.length = len;
	sge.lkey = d->reply_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)r;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;	/* OK: rdma-unsignaled-send-starvation -- each reply completes */
	if (ibv_post_send(qp, &wr, &bad)) {
		r->next = d->free_replies;
		d->free_replies = r;
		return -EIO;
	}
	return 0;
}

void srqd_send_done(struct srqd *d, const struct ibv_wc *wc)
{
	struct srqd_reply *r = (struct srqd_reply *)(uintptr_t)wc->wr_id;

	r->next = d->free_replies;
	d->free_replies = r;
}
