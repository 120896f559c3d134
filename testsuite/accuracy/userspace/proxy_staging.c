/*
 * rproxy: a socket-to-RDMA proxy.  Bytes read from a TCP client are copied
 * into a staging ring and forwarded to the RDMA peer with SENDs; replies
 * arrive by RECV into a second ring and are written back to the socket.
 * Nothing is ever accessed one-sidedly -- the proxy speaks a two-sided
 * protocol only.
 *
 * Not correct: the staging ring was registered with remote read/write
 * (copied from a prototype that let the peer pull data); the rkey never
 * leaves this file, so the rights only widen the attack surface.
 * Correct: the receive ring has LOCAL_WRITE only; sends are signaled every
 * RP_SIG_EVERY posts with an advancing counter.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RP_SLOTS	128
#define RP_SLOT		4096
#define RP_SIG_EVERY	32

struct rproxy {
	int            sock;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char          *tx_ring, *rx_ring;
	struct ibv_mr *tx_mr, *rx_mr;
	unsigned int   tx_head, unsignaled;
};

int rproxy_rings(struct rproxy *p)
{
	p->tx_ring = aligned_alloc(4096, RP_SLOTS * RP_SLOT);
	p->rx_ring = aligned_alloc(4096, RP_SLOTS * RP_SLOT);
	if (!p->tx_ring || !p->rx_ring)
		goto err;
	// BUG: rdma-remote-access-overbroad -- remote read/write on a ring whose rkey is never sent (only its lkey is used)
	p->tx_mr = ibv_reg_mr(p->pd, p->tx_ring, RP_SLOTS * RP_SLOT,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_WRITE);
	if (!p->tx_mr)
		goto err;
	/* OK: rdma-remote-access-overbroad, rdma-local-mr-management -- receive ring, local write only */
	p->rx_mr = ibv_reg_mr(p->pd, p->rx_ring, RP_SLOTS * RP_SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!p->rx_mr)
		goto err_tx;
	return 0;
err_tx:
	ibv_dereg_mr(p->tx_mr);
err:
	free(p->tx_ring);
	free(p->rx_ring);
	return -ENOMEM;
}

int rproxy_forward(struct rproxy *p)
{
	char *slot = p->tx_ring + (size_t)(p->tx_head % RP_SLOTS) * RP_SLOT;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	ssize_t n;

	n = read(p->sock, slot, RP_SLOT);
	if (n <= 0)
		return n ? -errno : 0;
	sge.addr = (uintptr_t)slot;
	sge.length = (uint32_t)n;
	sge.lkey = p->tx_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = p->tx_head;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (++p->unsignaled == RP_SIG_EVERY) {
		wr.send_flags = IBV_SEND_SIGNALED;
		p->unsignaled = 0;
	}
	p->tx_head++;
	return ibv_post_send(p->qp, &wr, &bad) ? -EIO : (int)n;
}

void rproxy_close(struct rproxy *p)
{
	ibv_dereg_mr(p->rx_mr);
	ibv_dereg_mr(p->tx_mr);
	free(p->rx_ring);
	free(p->tx_ring);
}
