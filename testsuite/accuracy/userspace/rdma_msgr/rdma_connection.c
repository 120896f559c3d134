/*
 * rdma_connection.c - TX path of a messenger connection.
 *
 * A message is copied into pool chunks, one scatter entry per chunk, and
 * posted as a chain of SENDs built in the connection (tx_wrs[]).  Messages
 * above MSGR_ZC_THRESHOLD skip the copy: the caller's segments are
 * registered and sent directly, and the registrations are dropped when
 * the send completes.  Send-queue space is accounted in credits; only
 * every MSGR_SIGNAL_EVERY-th work request asks for a completion, which
 * returns the credits of everything posted before it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdma_stack.h"

static int msgr_conn_post_chain(struct msgr_conn *conn, struct ibv_send_wr *first,
				struct ibv_send_wr *last, unsigned int n)
{
	struct ibv_send_wr *bad;
	int ret;

	if (conn->tx_credits < n)
		return -EAGAIN;

	last->next = NULL;
	// BUG(program): rdma-unsignaled-send-starvation -- conn->unsignaled is only ever reset, so no SEND asks for a completion and credits never come back
	if (conn->unsignaled >= MSGR_SIGNAL_EVERY) {
		last->send_flags |= IBV_SEND_SIGNALED;
		conn->unsignaled = 0;
	}
	ret = ibv_post_send(conn->qp, first, &bad);
	if (ret)
		return ret == ENOMEM ? -EAGAIN : -ret;
	conn->tx_credits -= n;
	for (; first; first = first->next)
		conn->tx_ring[conn->tx_head++ % MSGR_TX_QUEUE_LEN] = first->wr_id;
	return 0;
}

int msgr_conn_send(struct msgr_conn *conn, const struct iovec *iov, int iovcnt)
{
	struct msgr_pool *pool = &conn->ib->pool;
	unsigned int n = 0;
	size_t off = 0;
	int i, ret;

	for (i = 0; i < iovcnt; i++) {
		const char *src = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left) {
			struct msgr_chunk *c;
			size_t len;

			if (!n || conn->tx_chunks[n - 1]->bound == MSGR_CHUNK_SIZE) {
				if (n == conn->max_sge || !(c = msgr_pool_get(pool))) {
					ret = -EAGAIN;
					goto put_chunks;
				}
				conn->tx_chunks[n++] = c;
			}
			c = conn->tx_chunks[n - 1];
			len = MSGR_CHUNK_SIZE - c->bound;
			if (len > left)
				len = left;
			memcpy(c->buf + c->bound, src, len);
			c->bound += len;
			src += len;
			left -= len;
			off += len;
		}
	}

	if (!n)
		return 0;
	for (i = 0; i < (int)n; i++) {
		struct ibv_send_wr *wr = &conn->tx_wrs[i];

		conn->tx_sges[i].addr = (uintptr_t)conn->tx_chunks[i]->buf;
		conn->tx_sges[i].length = conn->tx_chunks[i]->bound;
		conn->tx_sges[i].lkey = conn->tx_chunks[i]->lkey;
		memset(wr, 0, sizeof(*wr));
		wr->wr_id = (uintptr_t)conn->tx_chunks[i];
		wr->sg_list = &conn->tx_sges[i];
		wr->num_sge = 1;
		wr->opcode = IBV_WR_SEND;
		wr->next = &conn->tx_wrs[i + 1];
	}
	ret = msgr_conn_post_chain(conn, &conn->tx_wrs[0], &conn->tx_wrs[n - 1], n);
	if (!ret)
		return (int)off;

put_chunks:
	while (n--)
		msgr_pool_put(pool, conn->tx_chunks[n]);
	return ret;
}

static void msgr_zc_release(struct msgr_zc *zc)
{
	while (zc->nmrs--)
		ibv_dereg_mr(zc->mrs[zc->nmrs]);	// BUG: rdma-registration-in-datapath -- zero-copy segments are deregistered on every send completion
	free(zc);
}

int msgr_conn_send_zc(struct msgr_conn *conn, const struct iovec *iov, int iovcnt)
{
	struct ibv_send_wr wr = { 0 };
	struct ibv_sge sge[MSGR_MAX_SGE];
	struct msgr_zc *zc;
	int i, ret;

	if (iovcnt > (int)conn->max_sge)
		return -EINVAL;
	zc = calloc(1, sizeof(*zc));
	if (!zc)
		return -ENOMEM;

	for (i = 0; i < iovcnt; i++) {
		// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- every segment of every large message is registered
		zc->mrs[i] = ibv_reg_mr(conn->ib->pd, iov[i].iov_base, iov[i].iov_len, IBV_ACCESS_LOCAL_WRITE);
		if (!zc->mrs[i]) {
			ret = -errno;
			zc->nmrs = i;
			msgr_zc_release(zc);	/* OK: rdma-mr-leak -- the segments registered so far are released */
			return ret;
		}
		sge[i].addr = (uintptr_t)iov[i].iov_base;
		sge[i].length = iov[i].iov_len;
		sge[i].lkey = zc->mrs[i]->lkey;
	}
	zc->nmrs = iovcnt;

	if (conn->closing || conn->tx_credits < 1) {
		free(zc);
		return -EAGAIN;		// BUG: rdma-mr-leak -- zc is freed with every segment MR still registered
	}

	wr.wr_id = (uintptr_t)zc | MSGR_WRID_ZC_BIT;
	wr.sg_list = sge;
	wr.num_sge = iovcnt;
	wr.opcode = IBV_WR_SEND;
	ret = msgr_conn_post_chain(conn, &wr, &wr, 1);
	if (ret)
		msgr_zc_release(zc);
	return ret;
}

/*
 * A signaled completion retires every work request posted before it:
 * walk the ring up to its wr_id, handing back chunks and registrations.
 */
void msgr_handle_tx_cqe(struct msgr_conn *conn, struct ibv_wc *wc)
{
	uint64_t wrid;

	if (conn->closing && wc->wr_id == (uintptr_t)conn)
		return;			/* beacon: the connection is flushed */

	do {
		if (conn->tx_tail == conn->tx_head)
			break;
		wrid = conn->tx_ring[conn->tx_tail++ % MSGR_TX_QUEUE_LEN];
		conn->tx_credits++;
		if (wrid & MSGR_WRID_ZC_BIT)
			msgr_zc_release((struct msgr_zc *)(uintptr_t)(wrid & ~MSGR_WRID_ZC_BIT));
		else
			msgr_pool_put(&conn->ib->pool, (struct msgr_chunk *)(uintptr_t)wrid);
	} while (wrid != wc->wr_id);
}
