/*
 * evsub: an event-subscription client.  Subscriptions and
 * unsubscriptions are SENDs to the broker; events come back as RECVs.
 * The client arms its CQ for solicited events only and sends its requests
 * with IBV_SEND_SOLICITED so the broker's CQ handler wakes up at once.
 *
 * Not correct: the QP was created with sq_sig_all = 0 and the only flag
 * any SEND carries is IBV_SEND_SOLICITED (a receive-side wake-up hint, not
 * a completion request): send-queue entries are never reclaimed and the
 * client can make only max_send_wr requests in its lifetime.
 * Correct: the request buffers are registered once for local access.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EVSUB_DEPTH	32
#define EVSUB_MSG	128

struct evsub {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char          *tx;
	struct ibv_mr *tx_mr;
	unsigned int   head;
};

int evsub_init(struct evsub *e)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = e->cq,
		.recv_cq = e->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = EVSUB_DEPTH, .max_recv_wr = EVSUB_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	e->tx = calloc(EVSUB_DEPTH, EVSUB_MSG);
	if (!e->tx)
		return -ENOMEM;
	/* OK: rdma-local-mr-management -- request slots registered once, SEND source */
	e->tx_mr = ibv_reg_mr(e->pd, e->tx, EVSUB_DEPTH * EVSUB_MSG, 0);
	if (!e->tx_mr) {
		free(e->tx);
		return -errno;
	}
	// BUG(file): rdma-unsignaled-send-starvation -- sq_sig_all is 0 (designated initializer) and no SEND requests a completion
	e->qp = ibv_create_qp(e->pd, &attr);
	if (!e->qp) {
		ibv_dereg_mr(e->tx_mr);
		free(e->tx);
		return -errno;
	}
	return ibv_req_notify_cq(e->cq, 1);
}

int evsub_request(struct evsub *e, const char *topic, int subscribe)
{
	char *slot = e->tx + (size_t)(e->head++ % EVSUB_DEPTH) * EVSUB_MSG;
	struct ibv_sge sge = { (uintptr_t)slot, EVSUB_MSG, e->tx_mr->lkey };
	struct ibv_send_wr wr, *bad;

	slot[0] = subscribe ? 'S' : 'U';
	strncpy(slot + 1, topic, EVSUB_MSG - 2);
	slot[EVSUB_MSG - 1] = 0;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SOLICITED;
	return ibv_post_send(e->qp, &wr, &bad);
}
