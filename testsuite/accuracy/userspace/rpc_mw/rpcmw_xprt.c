/*
 * rpcmw_xprt.c: queue pair and completion polling.
 *
 * Not correct: the send queue was sized "one SEND per call slot" when the
 * transport had no windows; a call now posts BIND_MW + SEND, and its reply
 * may need a LOCAL_INV (rpcmw_bind.c, rpcmw_reply.c), so a full set of
 * calls overflows the queue.
 */
#include "rpcmw.h"

#include <errno.h>
#include <string.h>

int rpcmw_create_qp(struct rpcmw_xprt *x)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = x->cq;
	attr.recv_cq = x->cq;
	attr.qp_type = IBV_QPT_RC;
	// BUG(program): rdma-send-queue-undersized -- a call posts BIND_MW + SEND (+ LOCAL_INV on reply) but the queue reserves one WR per slot
	attr.cap.max_send_wr = x->slots + 1; /* OK: rdma-send-queue-manual-factor -- no factor at all */
	attr.cap.max_recv_wr = x->slots;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	x->qp = ibv_create_qp(x->pd, &attr);
	return x->qp ? 0 : -errno;
}

void rpcmw_poll(struct rpcmw_xprt *x, const uint32_t *rx_xids)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(x->cq, 16, wc);
	for (i = 0; i < n; i++) {
		struct rpcmw_slot *s;

		if (wc[i].opcode == IBV_WC_LOCAL_INV) {
			s = (struct rpcmw_slot *)(uintptr_t)wc[i].wr_id;
			rpcmw_inv_done(x, s, wc[i].status == IBV_WC_SUCCESS);
			continue;
		}
		if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV)
			continue;
		s = &x->slot[rx_xids[wc[i].wr_id] % x->slots];
		s->wc_flags = wc[i].wc_flags;
		s->inv_rkey = wc[i].invalidated_rkey;
		rpcmw_reply(x, s);
	}
}
