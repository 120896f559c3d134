/*
 * va_rput_freelist.c - rendezvous path of a message-passing provider,
 * sender side.
 *
 * Small messages are copied into pre-registered control buffers.  A large
 * message goes out as an RTS carrying {addr, len, rkey}: the sender
 * registers the user buffer for REMOTE_READ, the receiver RDMA-READs it and
 * answers with FIN, and the send context is reported complete.  Send
 * contexts come from a free list; the user buffer belongs to the application
 * again once its completion is reported.
 *
 * Correct: FIN, the RTS timeout and a flushed QP all deregister the user
 * buffer (rdv_tx_dereg()) before the context goes back on the free list and
 * the buffer back to the application; a context whose RTS could not be
 * posted is deregistered first as well; a stale registration is dropped
 * before the handle is reused.
 * Wrong: cancel puts the context back with the buffer still registered
 * (deregistration is deferred to the context's next use), close frees the
 * context array without deregistering those cancelled contexts, an RTS that
 * finds no free control buffer leaks its registration, and endpoint setup
 * returns FAILURE with the control MR still registered.
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- registration per rendezvous is the provider's design; not annotated here
 */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <infiniband/verbs.h>

#define SUCCESS		(0)
#define FAILURE		(1)

#define RDV_CTRL_SLOTS	64		/* send slots; as many receive slots follow */
#define RDV_RTS_TMO_US	(5 * 1000 * 1000)

enum rdv_ctrl_type { RDV_RTS = 1, RDV_FIN = 2 };
enum rdv_tx_state { RDV_TX_FREE, RDV_TX_RTS_SENT };

struct rdv_ctrl {
	uint32_t type;
	int32_t status;
	uint64_t msg_id;
	uint64_t addr;
	uint64_t len;
	uint32_t rkey;
	uint32_t pad;
};

struct rdv_tx {
	struct rdv_tx *next;
	uint64_t msg_id;
	const void *buf;
	size_t len;
	struct ibv_mr *mr;
	uint64_t posted_us;
	void *context;
	int state;
};

struct rdv_ep {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct rdv_tx *tx_pool;
	struct rdv_tx *tx_free;
	unsigned int tx_count;
	struct rdv_ctrl *ctrl;
	struct ibv_mr *ctrl_mr;
	unsigned int ctrl_head;
	unsigned int ctrl_inflight;
	uint64_t next_seq;
	void (*comp)(void *context, int err);
};

static uint64_t rdv_now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (uint64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

static inline struct rdv_tx *rdv_tx_get(struct rdv_ep *ep)
{
	struct rdv_tx *tx = ep->tx_free;

	if (tx)
		ep->tx_free = tx->next;
	return tx;
}

static inline void rdv_tx_put(struct rdv_ep *ep, struct rdv_tx *tx)
{
	tx->state = RDV_TX_FREE;
	tx->context = NULL;
	tx->next = ep->tx_free;
	ep->tx_free = tx;
}

static inline void rdv_tx_dereg(struct rdv_tx *tx)
{
	if (tx->mr) {
		if (ibv_dereg_mr(tx->mr))
			fprintf(stderr, "rdv: dereg of msg %lu failed\n",
				(unsigned long)tx->msg_id);
		tx->mr = NULL;
	}
}

static struct rdv_ctrl *rdv_ctrl_get(struct rdv_ep *ep)
{
	struct rdv_ctrl *c;

	if (ep->ctrl_inflight == RDV_CTRL_SLOTS)
		return NULL;
	c = &ep->ctrl[ep->ctrl_head];
	ep->ctrl_head = (ep->ctrl_head + 1) % RDV_CTRL_SLOTS;
	ep->ctrl_inflight++;
	return c;
}

static int rdv_post_recv(struct rdv_ep *ep, struct rdv_ctrl *c)
{
	struct ibv_sge sge = { (uintptr_t)c, sizeof(*c), ep->ctrl_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uintptr_t)c, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(ep->qp, &wr, &bad);
}

static int rdv_post_ctrl(struct rdv_ep *ep, struct rdv_ctrl *c)
{
	struct ibv_sge sge = { (uintptr_t)c, sizeof(*c), ep->ctrl_mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)c;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(ep->qp, &wr, &bad);
}

int rdv_ep_init(struct rdv_ep *ep, unsigned int tx_count)
{
	size_t ctrl_size = 2 * RDV_CTRL_SLOTS * sizeof(struct rdv_ctrl);
	unsigned int i;

	ep->ctrl = memalign(4096, ctrl_size);
	if (!ep->ctrl) {
		fprintf(stderr, "Couldn't allocate control buffers\n");
		return FAILURE;
	}
	memset(ep->ctrl, 0, ctrl_size);

	ep->ctrl_mr = ibv_reg_mr(ep->pd, ep->ctrl, ctrl_size, IBV_ACCESS_LOCAL_WRITE);
	if (!ep->ctrl_mr) {
		fprintf(stderr, "Couldn't register control MR\n");
		goto free_ctrl;
	}

	ep->tx_pool = calloc(tx_count, sizeof(*ep->tx_pool));
	if (!ep->tx_pool) {
		fprintf(stderr, "Couldn't allocate send contexts\n");
		goto free_ctrl;		// BUG: rdma-mr-leak -- the control MR is not deregistered on this path
	}
	ep->tx_count = tx_count;
	ep->tx_free = NULL;
	for (i = 0; i < tx_count; i++)
		rdv_tx_put(ep, &ep->tx_pool[i]);

	for (i = 0; i < RDV_CTRL_SLOTS; i++) {
		if (rdv_post_recv(ep, &ep->ctrl[RDV_CTRL_SLOTS + i])) {
			fprintf(stderr, "Couldn't post receive %u\n", i);
			goto free_pool;
		}
	}
	return SUCCESS;

free_pool:
	free(ep->tx_pool);
	ep->tx_pool = NULL;
	ibv_dereg_mr(ep->ctrl_mr);	// OK: rdma-mr-leak -- released before the failure return
free_ctrl:
	free(ep->ctrl);	// OK: rdma-invalidation-leak -- the control MR has local access only
	return FAILURE;
}

int rdv_send(struct rdv_ep *ep, const void *buf, size_t len, void *context)
{
	struct rdv_ctrl *rts;
	struct rdv_tx *tx;

	tx = rdv_tx_get(ep);
	if (!tx)
		return -EAGAIN;

	/* a cancelled context still carries its old registration */
	if (tx->mr)
		rdv_tx_dereg(tx);
	tx->mr = ibv_reg_mr(ep->pd, (void *)buf, len, IBV_ACCESS_REMOTE_READ);	// OK: rdma-mr-leak -- a leftover registration was released just above
	if (!tx->mr) {
		rdv_tx_put(ep, tx);
		return -errno;
	}
	tx->buf = buf;
	tx->len = len;
	tx->context = context;
	tx->msg_id = (ep->next_seq++ << 16) | (uint64_t)(tx - ep->tx_pool);

	rts = rdv_ctrl_get(ep);
	if (!rts)
		return -EAGAIN;		// BUG: rdma-mr-leak -- the user buffer stays registered and the context is neither in flight nor on the free list

	rts->type = RDV_RTS;
	rts->status = 0;
	rts->msg_id = tx->msg_id;
	rts->addr = (uintptr_t)buf;
	rts->len = len;
	rts->rkey = tx->mr->rkey;
	if (rdv_post_ctrl(ep, rts)) {
		ep->ctrl_inflight--;
		rdv_tx_dereg(tx);
		rdv_tx_put(ep, tx);	// OK: rdma-invalidation-leak -- rdv_tx_dereg() deregistered the buffer first
		return -EIO;
	}
	tx->state = RDV_TX_RTS_SENT;
	tx->posted_us = rdv_now_us();
	return 0;
}

static struct rdv_tx *rdv_tx_lookup(struct rdv_ep *ep, uint64_t msg_id)
{
	struct rdv_tx *tx = &ep->tx_pool[(msg_id & 0xffff) % ep->tx_count];

	if (tx->state != RDV_TX_RTS_SENT || tx->msg_id != msg_id)
		return NULL;
	return tx;
}

static void rdv_handle_fin(struct rdv_ep *ep, const struct rdv_ctrl *fin)
{
	struct rdv_tx *tx = rdv_tx_lookup(ep, fin->msg_id);

	if (!tx)
		return;
	rdv_tx_dereg(tx);
	ep->comp(tx->context, fin->status);
	rdv_tx_put(ep, tx);	// OK: rdma-invalidation-leak -- deregistered through rdv_tx_dereg() before the context is recycled
}

int rdv_cancel(struct rdv_ep *ep, void *context)
{
	unsigned int i;

	for (i = 0; i < ep->tx_count; i++) {
		struct rdv_tx *tx = &ep->tx_pool[i];

		if (tx->state != RDV_TX_RTS_SENT || tx->context != context)
			continue;
		/*
		 * The peer may be in the middle of its RDMA READ; deregistering
		 * now would fail it with a remote access error.  Leave the MR to
		 * rdv_send(), which drops it when this context is reused.
		 */
		ep->comp(tx->context, -ECANCELED);
		// OK: rdma-mr-leak -- the handle stays in tx->mr and rdv_send() deregisters it when the context is reused
		rdv_tx_put(ep, tx);	// BUG: rdma-invalidation-leak -- the buffer goes back to the application while the rkey in the RTS still reads it
		return 0;
	}
	return -ENOENT;
}

static void rdv_check_timeouts(struct rdv_ep *ep)
{
	uint64_t now = rdv_now_us();
	unsigned int i;

	for (i = 0; i < ep->tx_count; i++) {
		struct rdv_tx *tx = &ep->tx_pool[i];

		if (tx->state != RDV_TX_RTS_SENT || now - tx->posted_us < RDV_RTS_TMO_US)
			continue;
		rdv_tx_dereg(tx);
		ep->comp(tx->context, -ETIMEDOUT);
		rdv_tx_put(ep, tx);	// OK: rdma-invalidation-leak -- the timeout deregisters before giving the buffer back
	}
}

static void rdv_flush(struct rdv_ep *ep, int err)
{
	unsigned int i;

	for (i = 0; i < ep->tx_count; i++) {
		struct rdv_tx *tx = &ep->tx_pool[i];

		if (tx->state != RDV_TX_RTS_SENT)
			continue;
		rdv_tx_dereg(tx);
		ep->comp(tx->context, err);
		rdv_tx_put(ep, tx);	// OK: rdma-invalidation-leak -- deregistered first
	}
}

int rdv_progress(struct rdv_ep *ep)
{
	struct ibv_wc wc[16];
	int i, n;

	n = ibv_poll_cq(ep->cq, 16, wc);
	if (n < 0)
		return -EIO;
	for (i = 0; i < n; i++) {
		struct rdv_ctrl *c = (struct rdv_ctrl *)(uintptr_t)wc[i].wr_id;

		if (wc[i].status != IBV_WC_SUCCESS) {
			rdv_flush(ep, -EIO);
			return -EIO;
		}
		if (wc[i].opcode == IBV_WC_SEND) {
			ep->ctrl_inflight--;
			continue;
		}
		if (c->type == RDV_FIN)
			rdv_handle_fin(ep, c);
		rdv_post_recv(ep, c);
	}
	rdv_check_timeouts(ep);
	return n;
}

void rdv_ep_close(struct rdv_ep *ep)
{
	rdv_flush(ep, -ECANCELED);
	free(ep->tx_pool);	// BUG: rdma-mr-leak, rdma-invalidation-leak -- contexts returned by rdv_cancel() are free but still hold their registered MRs, which are freed with the array
	ep->tx_pool = NULL;
	ep->tx_free = NULL;

	ibv_dereg_mr(ep->ctrl_mr);
	free(ep->ctrl);
}
