/*
 * logfwd: forwards log lines to a collector with SENDs from a ring of
 * pre-registered slots.  Completion moderation is in a helper,
 * logfwd_send_flags(), which asks for a completion when the number of
 * unsignaled sends reaches LOGFWD_SIG -- but the counter is only ever
 * reset, never advanced (the increment was lost when the post path was
 * split out of logfwd_emit()).  With sq_sig_all = 0 no send is ever
 * signaled; after max_send_wr lines the forwarder stops.
 *
 * Correct: the ring is registered once for local access; the QP's sizes
 * are small constants.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOGFWD_SLOTS	256
#define LOGFWD_LINE	512
#define LOGFWD_SIG	64

struct logfwd {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char          *ring;
	struct ibv_mr *ring_mr;
	unsigned int   head;
	unsigned int   unsignaled;
};

int logfwd_init(struct logfwd *f)
{
	struct ibv_qp_init_attr attr;

	f->ring = calloc(LOGFWD_SLOTS, LOGFWD_LINE);
	if (!f->ring)
		return -ENOMEM;
	/* OK: rdma-local-mr-management -- ring registered once, SEND source */
	f->ring_mr = ibv_reg_mr(f->pd, f->ring, LOGFWD_SLOTS * LOGFWD_LINE, 0);
	if (!f->ring_mr) {
		free(f->ring);
		return -errno;
	}
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = f->cq;
	attr.recv_cq = f->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = LOGFWD_SLOTS;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	f->qp = ibv_create_qp(f->pd, &attr);
	if (!f->qp) {
		ibv_dereg_mr(f->ring_mr);
		free(f->ring);
		return -errno;
	}
	f->unsignaled = 0;
	return 0;
}

static unsigned int logfwd_send_flags(struct logfwd *f)
{
	// BUG: rdma-unsignaled-send-starvation -- 'unsignaled' is reset but never advanced, so no send is ever signaled
	if (f->unsignaled >= LOGFWD_SIG) {
		f->unsignaled = 0;
		return IBV_SEND_SIGNALED;
	}
	return 0;
}

static int logfwd_post(struct logfwd *f, char *slot, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)slot, len, f->ring_mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = logfwd_send_flags(f);
	return ibv_post_send(f->qp, &wr, &bad);
}

int logfwd_emit(struct logfwd *f, const char *line)
{
	char *slot = f->ring + (size_t)(f->head++ % LOGFWD_SLOTS) * LOGFWD_LINE;
	size_t len = strnlen(line, LOGFWD_LINE - 1);

	memcpy(slot, line, len);
	slot[len] = '\n';
	return logfwd_post(f, slot, (uint32_t)len + 1) ? -EIO : 0;
}
