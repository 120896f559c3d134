/*
 * hbeat: liveness heartbeats between cluster members over RC QPs created
 * with ibv_create_qp_ex().  A heartbeat is a 24-byte inline SEND posted
 * every 100 ms with the extended work-request API.
 *
 * The QP asks for completions only on requested work requests (sq_sig_all
 * left 0), and the heartbeat sets wr_flags to IBV_SEND_INLINE alone "since
 * the buffer is copied anyway".  Inline data frees the buffer, not the
 * send-queue entry: nothing ever requests a completion, so after
 * max_send_wr heartbeats (about 6 seconds) every post fails with ENOMEM
 * and the member is declared dead by its peers.
 *
 * Correct: 24 bytes of inline data are within every device's limit; the
 * queue depth is small and constant.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define HB_SQ_DEPTH	64

struct hb_msg {
	uint64_t member_id;
	uint64_t epoch;
	uint64_t ts_ns;
};

struct hb_link {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	uint64_t            member_id;
	uint64_t            epoch;
};

int hb_link_create(struct hb_link *l)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = l->cq;
	attr.recv_cq = l->cq;
	attr.pd = l->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND;
	attr.cap.max_send_wr = HB_SQ_DEPTH;
	attr.cap.max_recv_wr = HB_SQ_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct hb_msg); /* OK: rdma-queue-cap-unchecked -- 24 bytes of inline data */
	// BUG(file): rdma-unsignaled-send-starvation -- requested-only signaling and no heartbeat ever requests a completion
	l->qp = ibv_create_qp_ex(l->ctx, &attr);
	if (!l->qp)
		return -errno;
	l->qpx = ibv_qp_to_qp_ex(l->qp);
	return 0;
}

int hb_send(struct hb_link *l)
{
	struct hb_msg m;
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	m.member_id = l->member_id;
	m.epoch = l->epoch;
	m.ts_ns = (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;

	ibv_wr_start(l->qpx);
	l->qpx->wr_id = m.ts_ns;
	l->qpx->wr_flags = IBV_SEND_INLINE;
	ibv_wr_send(l->qpx);
	ibv_wr_set_inline_data(l->qpx, &m, sizeof(m));
	return ibv_wr_complete(l->qpx);
}

int hb_loop(struct hb_link *l, volatile int *stop)
{
	struct timespec period = { 0, 100 * 1000 * 1000 };
	int ret;

	while (!*stop) {
		ret = hb_send(l);
		if (ret)
			return -ret;
		nanosleep(&period, NULL);
	}
	return 0;
}
