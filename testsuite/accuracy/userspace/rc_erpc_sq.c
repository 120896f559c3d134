/*
 * rc_erpc_sq.c - "rpcx": a small eRPC-style RPC transport over RC verbs.
 *
 * One RC QP per remote endpoint carries packets out of a pre-registered
 * msgbuf pool.  The TX path batches packets into a post list, accounts
 * send-queue slots with a credit counter (sq_credits, in work requests)
 * and asks for a completion once every RPCX_UNSIG_BATCH packets; each
 * send completion returns a batch of credits.  Session management
 * (handshakes, heartbeats) runs on a second, small QP.
 *
 * Large responses are not copied into packets: the server leaves them in
 * its msgbuf and hands the client the address and rkey to RDMA READ them.
 *
 * What is wrong here: the management QP never asks for a completion; the
 * RX ring is registered with remote write although its rkey never goes
 * anywhere; the management QP requests a large inline size without ever
 * checking what the device granted.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-invalidate-unchecked, rdma-unmap-before-invalidate -- not reviewed for this transport
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <endian.h>
#include <time.h>
#include <infiniband/verbs.h>

#define RPCX_SQ_DEPTH		2048	/* data SQ slots we would like */
#define RPCX_RQ_DEPTH		512
#define RPCX_POSTLIST		16
#define RPCX_UNSIG_BATCH	16
#define RPCX_MAX_INLINE		120
#define RPCX_MGMT_INLINE	512	/* room for a full session-connect packet */
#define RPCX_MSGBUF_SIZE	8192	/* header + payload */
#define RPCX_NUM_MSGBUFS	1024
#define RPCX_MTU		4096
#define RPCX_RECV_SIZE		(sizeof(struct rpcx_pkthdr) + RPCX_MTU)

#define rpcx_unlikely(x)	__builtin_expect(!!(x), 0)
#define RPCX_MIN(a, b)		((a) < (b) ? (a) : (b))

enum { RPCX_PKT_REQ = 1, RPCX_PKT_RESP, RPCX_PKT_RESP_LARGE };
enum { RPCX_MGMT_CONNECT = 1, RPCX_MGMT_HEARTBEAT };

struct rpcx_pkthdr {
	uint8_t		req_type;
	uint8_t		pkt_type;
	uint16_t	sess_num;
	uint32_t	req_num;
	uint32_t	msg_size;
	uint32_t	large_rkey;	/* RPCX_PKT_RESP_LARGE: server msgbuf key */
	uint64_t	large_addr;
};

struct rpcx_mgmt_pkt {
	uint8_t		type;
	uint8_t		pad;
	uint16_t	sess_num;
	uint32_t	seq;
	uint64_t	ts_ns;
	uint8_t		blob[64];	/* routing info for CONNECT */
};

/* A msgbuf is one slot of the pool: packet header, then the payload. */
struct rpcx_msgbuf {
	uint8_t			*buf;
	struct rpcx_pkthdr	*hdr;	/* == buf */
	uint32_t		len;	/* payload bytes after the header */
	uint32_t		idx;
	struct rpcx_msgbuf	*next_free;
};

struct rpcx_transport {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*send_cq;
	struct ibv_cq		*recv_cq;
	struct ibv_cq		*mgmt_cq;
	struct ibv_qp		*qp;		/* datapath */
	struct ibv_qp		*mgmt_qp;	/* session management */

	uint32_t		sq_credits;	/* free data SQ slots, in WRs */
	uint32_t		unsig_batch_cnt;
	uint32_t		max_inline;
	uint32_t		num_sessions;
	uint32_t		hb_seq;

	struct ibv_send_wr	tx_wr[RPCX_POSTLIST];
	struct ibv_sge		tx_sge[RPCX_POSTLIST];

	uint8_t			*ring;
	struct ibv_mr		*ring_mr;
	struct ibv_recv_wr	recv_wr[RPCX_RQ_DEPTH];
	struct ibv_sge		recv_sge[RPCX_RQ_DEPTH];

	uint8_t			*pool;
	struct ibv_mr		*pool_mr;
	struct rpcx_msgbuf	msgbufs[RPCX_NUM_MSGBUFS];
	struct rpcx_msgbuf	*free_list;
};

static int rpcx_create_data_qp(struct rpcx_transport *t)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(t->ctx, &da))
		return -errno;

	t->send_cq = ibv_create_cq(t->ctx, RPCX_MIN(RPCX_SQ_DEPTH, da.max_cqe),
				   NULL, NULL, 0);
	t->recv_cq = ibv_create_cq(t->ctx, RPCX_RQ_DEPTH, NULL, NULL, 0);
	if (!t->send_cq || !t->recv_cq)
		return -ENOMEM;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = t->send_cq;
	attr.recv_cq = t->recv_cq;
	attr.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- every data post is gated by sq_credits, counted in WRs */
	attr.cap.max_send_wr = RPCX_MIN(RPCX_SQ_DEPTH, (uint32_t)da.max_qp_wr); // OK: rdma-queue-cap-unchecked -- clamped to the device's max_qp_wr
	attr.cap.max_recv_wr = RPCX_RQ_DEPTH;
	attr.cap.max_send_sge = 2;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = RPCX_MAX_INLINE; // OK: rdma-queue-cap-unchecked -- the granted inline size is read back below

	t->qp = ibv_create_qp(t->pd, &attr);
	if (!t->qp)
		return -errno;

	/* the provider may round up or refuse part of the inline size */
	t->max_inline = attr.cap.max_inline_data;
	t->sq_credits = attr.cap.max_send_wr;
	t->unsig_batch_cnt = 0;
	return 0;
}

static int rpcx_create_mgmt_qp(struct rpcx_transport *t)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};

	t->mgmt_cq = ibv_create_cq(t->ctx, 2 * t->num_sessions + 1, NULL, NULL, 0);
	if (!t->mgmt_cq)
		return -ENOMEM;

	attr.send_cq = t->mgmt_cq;
	attr.recv_cq = t->mgmt_cq;
	/* OK: rdma-send-queue-manual-factor -- two management packets per session, nothing is registered per I/O */
	attr.cap.max_send_wr = 2 * t->num_sessions + 1;
	attr.cap.max_recv_wr = 2 * t->num_sessions + 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = RPCX_MGMT_INLINE; // BUG: rdma-queue-cap-unchecked -- 512 bytes of inline data requested without a look at what the device grants

	t->mgmt_qp = ibv_create_qp(t->pd, &attr);
	if (!t->mgmt_qp)
		return -errno;
	return 0;
}

static int rpcx_reg_memory(struct rpcx_transport *t)
{
	size_t ring_len = (size_t)RPCX_RQ_DEPTH * RPCX_RECV_SIZE;
	size_t pool_len = (size_t)RPCX_NUM_MSGBUFS * RPCX_MSGBUF_SIZE;
	uint32_t i;

	if (posix_memalign((void **)&t->ring, 4096, ring_len) ||
	    posix_memalign((void **)&t->pool, 4096, pool_len))
		return -ENOMEM;

	/* leave the ring open for one-sided writes, should we want them later */
	t->ring_mr = ibv_reg_mr(t->pd, t->ring, ring_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-remote-access-overbroad -- only the ring's lkey is ever used; no peer learns its rkey
	if (!t->ring_mr)
		return -errno;

	/* clients RDMA READ large responses straight out of the pool */
	t->pool_mr = ibv_reg_mr(t->pd, t->pool, pool_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); // OK: rdma-remote-access-overbroad -- the pool rkey is written into RESP_LARGE headers
	if (!t->pool_mr)
		return -errno;

	t->free_list = NULL;
	for (i = 0; i < RPCX_NUM_MSGBUFS; i++) {
		struct rpcx_msgbuf *mb = &t->msgbufs[i];

		mb->buf = t->pool + (size_t)i * RPCX_MSGBUF_SIZE;
		mb->hdr = (struct rpcx_pkthdr *)mb->buf;
		mb->idx = i;
		mb->next_free = t->free_list;
		t->free_list = mb;
	}
	return 0;
}

static int rpcx_fill_recvs(struct rpcx_transport *t)
{
	struct ibv_recv_wr *bad;
	uint32_t i;

	for (i = 0; i < RPCX_RQ_DEPTH; i++) {
		t->recv_sge[i].addr = (uintptr_t)(t->ring + (size_t)i * RPCX_RECV_SIZE);
		t->recv_sge[i].length = RPCX_RECV_SIZE;
		t->recv_sge[i].lkey = t->ring_mr->lkey;
		t->recv_wr[i].wr_id = i;
		t->recv_wr[i].sg_list = &t->recv_sge[i];
		t->recv_wr[i].num_sge = 1;
		t->recv_wr[i].next = (i + 1 < RPCX_RQ_DEPTH) ? &t->recv_wr[i + 1] : NULL;
	}
	return ibv_post_recv(t->qp, &t->recv_wr[0], &bad);
}

static void rpcx_reap_tx(struct rpcx_transport *t)
{
	struct ibv_wc wc[16];
	int i, n;

	n = ibv_poll_cq(t->send_cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			fprintf(stderr, "rpcx: send failed: %s\n",
				ibv_wc_status_str(wc[i].status));
		t->sq_credits += RPCX_UNSIG_BATCH;
	}
}

/*
 * Post up to RPCX_POSTLIST packets in one doorbell.  Returns the number of
 * packets posted; 0 when the send queue has no room even after reaping.
 */
size_t rpcx_tx_burst(struct rpcx_transport *t, struct rpcx_msgbuf **mbs,
			    size_t n)
{
	struct ibv_send_wr *bad;
	size_t i;

	if (n > RPCX_POSTLIST)
		n = RPCX_POSTLIST;
	if (t->sq_credits < n)
		rpcx_reap_tx(t);
	if (rpcx_unlikely(t->sq_credits < n))
		return 0;

	for (i = 0; i < n; i++) {
		struct rpcx_msgbuf *mb = mbs[i];
		struct ibv_send_wr *wr = &t->tx_wr[i];
		struct ibv_sge *sge = &t->tx_sge[i];

		sge->addr = (uintptr_t)mb->buf;
		sge->length = sizeof(*mb->hdr) + mb->len;
		sge->lkey = t->pool_mr->lkey;

		wr->wr_id = (uintptr_t)mb;
		wr->opcode = IBV_WR_SEND;
		wr->sg_list = sge;
		wr->num_sge = 1;
		wr->send_flags = 0;
		if (sge->length <= t->max_inline)
			wr->send_flags |= IBV_SEND_INLINE;

		/* one signaled send per batch returns the whole batch's credits */
		if (++t->unsig_batch_cnt == RPCX_UNSIG_BATCH) { // OK: rdma-unsignaled-send-starvation -- the batch counter advances with every packet
			wr->send_flags |= IBV_SEND_SIGNALED;
			t->unsig_batch_cnt = 0;
		}
		wr->next = (i + 1 < n) ? &t->tx_wr[i + 1] : NULL;
	}

	if (ibv_post_send(t->qp, &t->tx_wr[0], &bad))
		return 0;
	t->sq_credits -= n;
	return n;
}

static struct rpcx_msgbuf *rpcx_alloc_msgbuf(struct rpcx_transport *t)
{
	struct rpcx_msgbuf *mb = t->free_list;

	if (mb)
		t->free_list = mb->next_free;
	return mb;
}

/*
 * Respond with a header-only packet that tells the client where to RDMA
 * READ the response from; @resp stays owned by the session until the
 * client's next request acknowledges the read.
 */
size_t rpcx_send_large_resp(struct rpcx_transport *t, struct rpcx_msgbuf *resp,
			    uint16_t sess_num, uint32_t req_num)
{
	struct rpcx_msgbuf *ctl = rpcx_alloc_msgbuf(t);
	struct rpcx_pkthdr *h;

	if (!ctl)
		return 0;
	h = ctl->hdr;
	h->req_type = resp->hdr->req_type;
	h->pkt_type = RPCX_PKT_RESP_LARGE;
	h->sess_num = sess_num;
	h->req_num = req_num;
	h->msg_size = resp->len;
	h->large_addr = htobe64((uintptr_t)(resp->buf + sizeof(*resp->hdr)));
	h->large_rkey = htobe32(t->pool_mr->rkey);
	ctl->len = 0;
	return rpcx_tx_burst(t, &ctl, 1);
}

static int rpcx_mgmt_send(struct rpcx_transport *t, struct rpcx_mgmt_pkt *pkt)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)pkt,
		.length = sizeof(*pkt),
	};
	struct ibv_send_wr wr = {
		.wr_id = pkt->seq,
		.opcode = IBV_WR_SEND,
		.sg_list = &sge,
		.num_sge = 1,
		/* management packets are copied into the WQE, nothing to wait for */
		.send_flags = IBV_SEND_INLINE,
	};
	struct ibv_send_wr *bad;

	return ibv_post_send(t->mgmt_qp, &wr, &bad); // BUG(file): rdma-unsignaled-send-starvation -- no post on the management QP ever sets IBV_SEND_SIGNALED; its send queue fills after max_send_wr packets
}

int rpcx_heartbeat(struct rpcx_transport *t, uint16_t sess_num)
{
	struct rpcx_mgmt_pkt pkt;

	memset(&pkt, 0, sizeof(pkt));
	pkt.type = RPCX_MGMT_HEARTBEAT;
	pkt.sess_num = sess_num;
	pkt.seq = t->hb_seq++;
	pkt.ts_ns = (uint64_t)time(NULL) * 1000000000ull;
	return rpcx_mgmt_send(t, &pkt);
}

#define RPCX_FLUSH_WRID	UINT64_MAX

/* Move the data QP to error and wait until its send queue has flushed. */
static void rpcx_flush_tx(struct rpcx_transport *t)
{
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };
	struct ibv_send_wr marker = {
		.wr_id = RPCX_FLUSH_WRID,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad;
	struct ibv_wc wc;

	if (ibv_modify_qp(t->qp, &qa, IBV_QP_STATE))
		return;
	if (ibv_post_send(t->qp, &marker, &bad))
		return;
	for (;;) {
		int n = ibv_poll_cq(t->send_cq, 1, &wc);

		if (n < 0 || (n == 1 && wc.wr_id == RPCX_FLUSH_WRID))
			break;
	}
}

void rpcx_transport_destroy(struct rpcx_transport *t)
{
	if (t->qp) {
		rpcx_flush_tx(t);
		ibv_destroy_qp(t->qp);
	}
	if (t->mgmt_qp)
		ibv_destroy_qp(t->mgmt_qp);
	if (t->ring_mr)
		ibv_dereg_mr(t->ring_mr);
	if (t->pool_mr)
		ibv_dereg_mr(t->pool_mr);
	if (t->send_cq)
		ibv_destroy_cq(t->send_cq);
	if (t->recv_cq)
		ibv_destroy_cq(t->recv_cq);
	if (t->mgmt_cq)
		ibv_destroy_cq(t->mgmt_cq);
	if (t->pd)
		ibv_dealloc_pd(t->pd);
	free(t->ring);
	free(t->pool);
	free(t);
}

struct rpcx_transport *rpcx_transport_create(struct ibv_context *ctx,
					     uint32_t num_sessions)
{
	struct rpcx_transport *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->ctx = ctx;
	t->num_sessions = num_sessions;
	t->pd = ibv_alloc_pd(ctx);
	if (!t->pd)
		goto err;
	if (rpcx_reg_memory(t))
		goto err;
	if (rpcx_create_data_qp(t))
		goto err;
	if (rpcx_create_mgmt_qp(t))
		goto err;
	if (rpcx_fill_recvs(t))
		goto err;
	return t;
err:
	rpcx_transport_destroy(t);
	return NULL;
}
