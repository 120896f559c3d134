/*
 * udsvc: a service-discovery responder on an unreliable-datagram QP.
 * Queries arrive in a receive ring (40-byte GRH + payload); answers are
 * SENT from an answer pool through address handles cached per requester.
 * UD has no RDMA READ/WRITE at all, so no memory here can be accessed
 * remotely.
 *
 * Not correct: the answer pool is registered with remote read/write (the
 * helper was shared with the RC transport); over UD the rights are useless
 * and the rkey is never published.
 * Correct: periodic signaling (every 16th answer, counter advanced on each
 * post) keeps the send queue drained; the receive ring is LOCAL_WRITE.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UD_QKEY		0x11111111
#define UD_SLOTS	256
#define UD_MSG		(40 + 256)
#define UD_SIG_EVERY	16

struct udsvc {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char          *rx, *tx;
	struct ibv_mr *rx_mr, *tx_mr;
	unsigned int   tx_head, since_sig;
};

static unsigned int udsvc_rc_access(void)
{
	return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
}

int udsvc_init(struct udsvc *s)
{
	struct ibv_qp_init_attr attr;

	s->rx = calloc(UD_SLOTS, UD_MSG);
	s->tx = calloc(UD_SLOTS, UD_MSG);
	if (!s->rx || !s->tx)
		goto err;
	/* OK: rdma-local-mr-management -- receive ring registered once, local write */
	s->rx_mr = ibv_reg_mr(s->pd, s->rx, UD_SLOTS * UD_MSG, IBV_ACCESS_LOCAL_WRITE);
	if (!s->rx_mr)
		goto err;
	// BUG: rdma-remote-access-overbroad -- remote rights on a UD send pool; no rkey is ever sent (UD has no RDMA)
	s->tx_mr = ibv_reg_mr(s->pd, s->tx, UD_SLOTS * UD_MSG, udsvc_rc_access());
	if (!s->tx_mr)
		goto err_rx;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = s->cq;
	attr.recv_cq = s->cq;
	attr.qp_type = IBV_QPT_UD;
	attr.cap.max_send_wr = UD_SLOTS;
	attr.cap.max_recv_wr = UD_SLOTS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &attr);
	if (!s->qp)
		goto err_tx;
	return 0;
err_tx:
	ibv_dereg_mr(s->tx_mr);
err_rx:
	ibv_dereg_mr(s->rx_mr);
err:
	free(s->rx);
	free(s->tx);
	return -ENOMEM;
}

int udsvc_answer(struct udsvc *s, struct ibv_ah *ah, uint32_t qpn, const void *ans, uint32_t len)
{
	char *slot = s->tx + (size_t)(s->tx_head++ % UD_SLOTS) * UD_MSG;
	struct ibv_sge sge = { (uintptr_t)slot, len, s->tx_mr->lkey };
	struct ibv_send_wr wr, *bad;

	memcpy(slot, ans, len);
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = UD_QKEY;
	/* OK: rdma-unsignaled-send-starvation -- since_sig advances on every answer */
	if (++s->since_sig == UD_SIG_EVERY) {
		wr.send_flags = IBV_SEND_SIGNALED;
		s->since_sig = 0;
	}
	return ibv_post_send(s->qp, &wr, &bad);
}
