/*
 * An MPI-like point-to-point layer: eager messages go through pre-posted
 * bounce buffers, large messages use a GET rendezvous.  The sender
 * registers its buffer for REMOTE_READ and sends an RTS carrying address,
 * length and rkey; the receiver RDMA-READs the payload into the user's
 * receive buffer and answers with a FIN, on which the sender deregisters.
 *
 * Receive buffers go through a small registration cache (registered on
 * first use, kept afterwards), so the receive side registers once per
 * buffer, not once per message.  The send side registers per message.
 *
 * Correct: the sender's key goes out in the RTS and is killed by the
 * deregistration on FIN; a failed RTS post deregisters; the QP signals
 * every work request (sq_sig_all).
 * Not correct: the send path registers and deregisters on every large
 * message; the receive cache registers LOCAL_WRITE only although the
 * buffers are RDMA READ sinks (this library also runs on iWARP NICs).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PML_EAGER_LIMIT		4096
#define PML_SQ_DEPTH		256
#define PML_RCACHE_SLOTS	32

enum pml_hdr_type { PML_EAGER = 1, PML_RTS, PML_FIN };

struct pml_hdr {
	uint8_t  type;
	uint8_t  pad[3];
	uint32_t tag;
	uint64_t sreq;		/* sender's request, echoed in FIN */
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct pml_sreq {
	void          *buf;
	size_t         len;
	struct ibv_mr *mr;
	int            done;
};

struct pml_rreq {
	void          *buf;
	size_t         len;
	uint64_t       sreq;
	int            done;
};

struct pml_rcache_ent {
	void          *buf;
	size_t         len;
	struct ibv_mr *mr;
};

struct pml_ep {
	struct ibv_pd        *pd;
	struct ibv_cq        *cq;
	struct ibv_qp        *qp;
	struct ibv_mr        *ctrl_mr;
	struct pml_hdr        ctrl[PML_SQ_DEPTH];
	unsigned int          ctrl_next;
	struct pml_rcache_ent rcache[PML_RCACHE_SLOTS];
	unsigned int          rcache_next;
};

int pml_ep_create_qp(struct pml_ep *ep)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = ep->cq,
		.recv_cq = ep->cq,
		.cap = { .max_send_wr = PML_SQ_DEPTH, .max_recv_wr = PML_SQ_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,	/* OK: rdma-unsignaled-send-starvation -- every WR completes */
	};

	ep->qp = ibv_create_qp(ep->pd, &attr);
	return ep->qp ? 0 : -errno;
}

static int pml_send_ctrl(struct pml_ep *ep, const struct pml_hdr *h, uint64_t wr_id)
{
	struct pml_hdr *slot = &ep->ctrl[ep->ctrl_next++ % PML_SQ_DEPTH];
	struct ibv_sge sge = { (uintptr_t)slot, sizeof(*slot), ep->ctrl_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND }, *bad;

	*slot = *h;
	return ibv_post_send(ep->qp, &wr, &bad);
}

int pml_isend_rndv(struct pml_ep *ep, struct pml_sreq *s, uint32_t tag)
{
	struct pml_hdr h = { .type = PML_RTS };

	/* OK: rdma-remote-access-overbroad -- the rkey is sent in the RTS */
	// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the send buffer is registered for every large message
	s->mr = ibv_reg_mr(ep->pd, s->buf, s->len, IBV_ACCESS_REMOTE_READ);
	if (!s->mr)
		return -errno;
	h.tag = tag;
	h.sreq = (uintptr_t)s;
	h.addr = (uintptr_t)s->buf;
	h.rkey = s->mr->rkey;
	h.len = s->len;
	if (pml_send_ctrl(ep, &h, 0)) {
		/* OK: rdma-mr-leak -- a failed RTS deregisters the buffer */
		ibv_dereg_mr(s->mr); // BUG: rdma-registration-in-datapath -- the per-message registration undone on the failure path of the same message
		s->mr = NULL;
		return -EIO;
	}
	return 0;
}

static struct ibv_mr *pml_rcache_get(struct pml_ep *ep, void *buf, size_t len)
{
	struct pml_rcache_ent *e;
	unsigned int i;

	for (i = 0; i < PML_RCACHE_SLOTS; i++) {
		e = &ep->rcache[i];
		if (e->mr && e->buf == buf && e->len >= len)
			return e->mr;
	}
	e = &ep->rcache[ep->rcache_next++ % PML_RCACHE_SLOTS];
	if (e->mr)
		ibv_dereg_mr(e->mr);	/* OK: rdma-registration-in-datapath -- cache replacement, not per message */
	e->buf = buf;
	e->len = len;
	/* OK: rdma-registration-in-datapath -- cache fill: kept for later messages into the same buffer */
	e->mr = ibv_reg_mr(ep->pd, buf, len, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- MR is the sink of the ULP's own RDMA READ
	return e->mr;
}

static int pml_handle_rts(struct pml_ep *ep, const struct pml_hdr *h, struct pml_rreq *r)
{
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (h->len > r->len)
		return -EMSGSIZE;
	mr = pml_rcache_get(ep, r->buf, r->len);
	if (!mr)
		return -errno;
	r->sreq = h->sreq;
	sge.addr = (uintptr_t)r->buf;
	sge.length = h->len;
	sge.lkey = mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)r;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = h->addr;
	wr.wr.rdma.rkey = h->rkey;
	return ibv_post_send(ep->qp, &wr, &bad); // BUG: rdma-access-flags-transport -- READ sink from pml_rcache_get() has no REMOTE_WRITE; fails on iWARP
}

static void pml_handle_fin(struct pml_ep *ep, const struct pml_hdr *h)
{
	struct pml_sreq *s = (struct pml_sreq *)(uintptr_t)h->sreq;

	(void)ep;
	/* OK: rdma-invalidation-leak -- deregistration kills the key the RTS carried */
	ibv_dereg_mr(s->mr); // BUG: rdma-registration-in-datapath -- per-message deregistration in the completion path
	s->mr = NULL;
	s->done = 1;
}

void pml_progress_wc(struct pml_ep *ep, struct ibv_wc *wc, struct pml_hdr *rx,
		     struct pml_rreq *posted)
{
	if (wc->status != IBV_WC_SUCCESS)
		return;
	switch (wc->opcode) {
	case IBV_WC_RECV:
		if (rx->type == PML_RTS)
			pml_handle_rts(ep, rx, posted);
		else if (rx->type == PML_FIN)
			pml_handle_fin(ep, rx);
		break;
	case IBV_WC_RDMA_READ: {
		struct pml_rreq *r = (struct pml_rreq *)(uintptr_t)wc->wr_id;
		struct pml_hdr fin = { .type = PML_FIN, .sreq = r->sreq };

		r->done = 1;
		pml_send_ctrl(ep, &fin, 0);
		break;
	}
	default:
		break;
	}
}

void pml_ep_close(struct pml_ep *ep)
{
	unsigned int i;

	ibv_destroy_qp(ep->qp);
	for (i = 0; i < PML_RCACHE_SLOTS; i++)
		if (ep->rcache[i].mr)
			ibv_dereg_mr(ep->rcache[i].mr);
	ibv_dereg_mr(ep->ctrl_mr);
}
