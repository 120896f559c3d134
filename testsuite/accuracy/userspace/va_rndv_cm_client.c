/*
 * va_rndv_cm_client.c - rendezvous GET client for an object server, on
 * librdmacm (rdma_create_ep / rdma_post_send).
 *
 * Control messages use buffers registered with rdma_reg_msgs() at connect
 * time.  Every table entry owns a bounce buffer; a GET registers the part of
 * it it needs with rdma_reg_write(), sends address and rkey to the server
 * with rdma_post_send(), and the server RDMA-WRITEs the object and answers
 * with PUT_DONE (or REJECT).  Entries are handed out by their in_use flag.
 *
 * Correct: PUT_DONE deregisters the sink before the data is copied out and
 * the entry recycled; a failed send and a disconnect deregister first too;
 * the message buffers (local access only) may be freed before they are
 * deregistered.
 * Wrong: REJECT recycles the entry but keeps the sink registered "for the
 * next GET", the timeout path drops the MR handle, close() frees the bounce
 * buffers before deregistering their MRs, and connect leaks the receive MR
 * when registering the send buffers fails.
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- per-GET registration is the design under test here; sizing and migration notes are not annotated
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define GC_MAX_REQS	32
#define GC_MAX_OBJ	(1u << 20)
#define GC_TIMEOUT_S	10

enum { GC_OP_GET = 1, GC_OP_PUT_DONE, GC_OP_REJECT };

struct gc_wire {
	uint8_t op;
	uint8_t rsvd[3];
	uint32_t req_id;
	uint64_t obj;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
	int32_t status;
	uint32_t pad;
};

typedef void (*gc_cb_t)(void *arg, const void *data, size_t len, int status);

struct gc_req {
	int in_use;
	uint32_t id;
	char *bounce;			/* GC_MAX_OBJ, owned by the entry */
	struct ibv_mr *mr;		/* sink registration of the current GET */
	size_t len;
	time_t start;
	gc_cb_t cb;
	void *arg;
};

struct gc_client {
	struct rdma_cm_id *id;
	struct gc_wire *tx;
	struct gc_wire *rx;
	struct ibv_mr *tx_mr;
	struct ibv_mr *rx_mr;
	struct gc_req reqs[GC_MAX_REQS];
	uint32_t next_id;
	unsigned long timeouts;
};

static struct gc_req *gc_req_alloc(struct gc_client *c)
{
	int i;

	for (i = 0; i < GC_MAX_REQS; i++) {
		if (!c->reqs[i].in_use) {
			c->reqs[i].in_use = 1;
			c->reqs[i].id = c->next_id++;
			return &c->reqs[i];
		}
	}
	return NULL;
}

static struct gc_req *gc_req_find(struct gc_client *c, uint32_t id)
{
	int i;

	for (i = 0; i < GC_MAX_REQS; i++)
		if (c->reqs[i].in_use && c->reqs[i].id == id)
			return &c->reqs[i];
	return NULL;
}

int gc_connect(struct gc_client *c, const char *host, const char *port)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	int i, ret;

	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	if (rdma_getaddrinfo(host, port, &hints, &res))
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = GC_MAX_REQS;
	attr.cap.max_recv_wr = GC_MAX_REQS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	ret = rdma_create_ep(&c->id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	if (ret)
		return -errno;

	c->tx = calloc(GC_MAX_REQS, sizeof(*c->tx));
	c->rx = calloc(GC_MAX_REQS, sizeof(*c->rx));
	if (!c->tx || !c->rx)
		goto err_bufs;

	c->rx_mr = rdma_reg_msgs(c->id, c->rx, GC_MAX_REQS * sizeof(*c->rx));
	if (!c->rx_mr)
		goto err_bufs;
	c->tx_mr = rdma_reg_msgs(c->id, c->tx, GC_MAX_REQS * sizeof(*c->tx));
	if (!c->tx_mr)
		goto err_bufs;	// BUG: rdma-mr-leak -- skips the rdma_dereg_mr() of the receive MR registered just above

	for (i = 0; i < GC_MAX_REQS; i++) {
		c->reqs[i].bounce = malloc(GC_MAX_OBJ);
		if (!c->reqs[i].bounce)
			goto err_bounce;
	}

	for (i = 0; i < GC_MAX_REQS; i++) {
		if (rdma_post_recv(c->id, &c->rx[i], &c->rx[i], sizeof(c->rx[i]), c->rx_mr))
			goto err_bounce;
	}

	if (rdma_connect(c->id, NULL))
		goto err_bounce;
	return 0;

err_bounce:
	for (i = 0; i < GC_MAX_REQS; i++) {
		free(c->reqs[i].bounce);
		c->reqs[i].bounce = NULL;
	}
	rdma_dereg_mr(c->tx_mr);	// OK: rdma-mr-leak -- both message MRs are released on this unwinding path
	rdma_dereg_mr(c->rx_mr);
err_bufs:
	free(c->tx);
	free(c->rx);	// OK: rdma-invalidation-leak -- the receive ring is registered for local access only
	rdma_destroy_ep(c->id);
	return -ENOMEM;
}

int gc_get(struct gc_client *c, uint64_t obj, size_t len, gc_cb_t cb, void *arg)
{
	struct gc_wire *w;
	struct gc_req *r;

	if (len == 0 || len > GC_MAX_OBJ)
		return -EINVAL;
	r = gc_req_alloc(c);
	if (!r)
		return -EAGAIN;

	if (r->mr && r->mr->length < len) {
		rdma_dereg_mr(r->mr);
		r->mr = NULL;	// OK: rdma-mr-leak -- the too-small registration was deregistered first
	}
	if (!r->mr) {
		r->mr = rdma_reg_write(c->id, r->bounce, len);
		if (!r->mr) {
			r->in_use = 0;
			return -ENOMEM;
		}
	}
	r->len = len;
	r->cb = cb;
	r->arg = arg;
	r->start = time(NULL);

	w = &c->tx[r - c->reqs];
	memset(w, 0, sizeof(*w));
	w->op = GC_OP_GET;
	w->req_id = r->id;
	w->obj = obj;
	w->addr = (uint64_t)(uintptr_t)r->bounce;
	w->rkey = r->mr->rkey;
	w->len = (uint32_t)len;

	if (rdma_post_send(c->id, r, w, sizeof(*w), c->tx_mr, IBV_SEND_SIGNALED)) {
		rdma_dereg_mr(r->mr);
		r->mr = NULL;	// OK: rdma-mr-leak -- deregistered on the line above
		r->in_use = 0;	// OK: rdma-invalidation-leak -- rdma_dereg_mr() killed the rkey before the entry is recycled
		return -errno;
	}
	return 0;
}

static void gc_handle_reply(struct gc_client *c, const struct gc_wire *w)
{
	struct gc_req *r = gc_req_find(c, w->req_id);

	if (!r)
		return;

	if (w->op == GC_OP_REJECT) {
		/* nothing was written; keep the sink registered for the next GET */
		r->cb(r->arg, NULL, 0, w->status);
		// OK: rdma-mr-leak -- the handle stays in r->mr; gc_get() or gc_close() deregisters it
		r->in_use = 0;	// BUG: rdma-invalidation-leak -- the server still holds the rkey of the sink that the next GET on this entry reuses
		return;
	}

	rdma_dereg_mr(r->mr);
	r->mr = NULL;
	r->cb(r->arg, r->bounce, w->len, 0);
	r->in_use = 0;	// OK: rdma-invalidation-leak -- the sink was deregistered before the data was handed out
}

void gc_expire(struct gc_client *c)
{
	time_t now = time(NULL);
	int i;

	for (i = 0; i < GC_MAX_REQS; i++) {
		struct gc_req *r = &c->reqs[i];

		if (!r->in_use || now - r->start < GC_TIMEOUT_S)
			continue;
		fprintf(stderr, "GET %u: no reply after %d s (sink rkey 0x%x)\n",
			r->id, GC_TIMEOUT_S, r->mr->rkey);
		c->timeouts++;
		r->cb(r->arg, NULL, 0, -ETIMEDOUT);
		r->in_use = 0;	// BUG: rdma-invalidation-leak -- a late server can still RDMA-WRITE into the bounce buffer of the next GET
		r->mr = NULL;	// BUG: rdma-mr-leak -- the sink MR is dropped without rdma_dereg_mr()
	}
}

static void gc_abort_all(struct gc_client *c, int status)
{
	int i;

	for (i = 0; i < GC_MAX_REQS; i++) {
		struct gc_req *r = &c->reqs[i];

		if (!r->in_use)
			continue;
		if (r->mr) {
			rdma_dereg_mr(r->mr);
			r->mr = NULL;	// OK: rdma-mr-leak -- deregistered first
		}
		r->cb(r->arg, NULL, 0, status);
		r->in_use = 0;	// OK: rdma-invalidation-leak -- the sink's key died with rdma_dereg_mr()
	}
}

int gc_progress(struct gc_client *c)
{
	struct ibv_wc wc;
	int n, reaped = 0;

	while ((n = ibv_poll_cq(c->id->recv_cq, 1, &wc)) > 0) {
		struct gc_wire *w = (struct gc_wire *)(uintptr_t)wc.wr_id;

		if (wc.status != IBV_WC_SUCCESS) {
			gc_abort_all(c, -ECONNRESET);
			return -EIO;
		}
		gc_handle_reply(c, w);
		rdma_post_recv(c->id, w, w, sizeof(*w), c->rx_mr);
		reaped++;
	}
	while ((n = ibv_poll_cq(c->id->send_cq, 1, &wc)) > 0) {
		if (wc.status != IBV_WC_SUCCESS) {
			gc_abort_all(c, -ECONNRESET);
			return -EIO;
		}
	}
	gc_expire(c);
	return reaped;
}

void gc_close(struct gc_client *c)
{
	int i;

	for (i = 0; i < GC_MAX_REQS; i++) {
		free(c->reqs[i].bounce);	// BUG: rdma-invalidation-leak -- a sink MR left by REJECT is still registered for remote write here and deregistered only below
		c->reqs[i].bounce = NULL;
	}
	free(c->tx);	// OK: rdma-invalidation-leak -- message buffers are registered for local access only, no rkey went out
	free(c->rx);
	rdma_dereg_mr(c->tx_mr);
	rdma_dereg_mr(c->rx_mr);
	for (i = 0; i < GC_MAX_REQS; i++) {
		if (c->reqs[i].mr) {
			rdma_dereg_mr(c->reqs[i].mr);
			c->reqs[i].mr = NULL;
		}
	}
	rdma_disconnect(c->id);
	rdma_destroy_ep(c->id);
}
