/*
 * iorpc: client side of a request/response RPC library over one RC QP.
 * A call is a header (from the call slot's header area) plus the caller's
 * payload, sent zero-copy as one multi-SGE SEND.
 *
 *  - iorpc_call(): one payload buffer.  Payload buffers are looked up in a
 *    small registration cache (8 entries, LRU eviction), so the hot
 *    buffers of an application are registered once.
 *  - iorpc_callv(): a payload vector of up to IORPC_MAX_IOV elements
 *    (added later for scatter-gather payloads).  Every element is
 *    registered when the call is made and deregistered when its SEND
 *    completes.
 *
 * Header areas are allocated and registered on first use of a group of
 * slots and kept for the life of the connection.
 *
 * Correct: the cache and the first-use header areas; every unwinding
 * path releases what it registered.
 * Not correct: the vectored path registers and deregisters once per call
 * (it should use the cache); the QP asks for IORPC_MAX_IOV + 1 send SGEs
 * without comparing with the device's max_sge.
 */
#include <infiniband/verbs.h>
#include <sys/uio.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define IORPC_MAX_IOV		16
#define IORPC_SLOTS		128
#define IORPC_SLOTS_PER_GRP	32
#define IORPC_NGRP		(IORPC_SLOTS / IORPC_SLOTS_PER_GRP)
#define IORPC_CACHE		8

struct iorpc_hdr {
	uint64_t call_id;
	uint32_t proc;
	uint32_t len;
};

struct iorpc_call {
	bool            busy;
	uint64_t        id;
	int             niov;
	struct ibv_mr  *iov_mr[IORPC_MAX_IOV];
	struct iorpc_cache_ent *ent;	/* cache entry used by iorpc_call() */
	void          (*cb)(void *arg, int status);
	void           *arg;
};

struct iorpc_cache_ent {
	const void    *buf;
	size_t         len;
	struct ibv_mr *mr;
	unsigned int   refs;		/* calls in flight using it */
	uint64_t       stamp;
};

struct iorpc_conn {
	struct ibv_context     *ctx;
	struct ibv_pd          *pd;
	struct ibv_cq          *cq;
	struct ibv_qp          *qp;
	struct iorpc_hdr       *hdr_grp[IORPC_NGRP];
	struct ibv_mr          *hdr_mr[IORPC_NGRP];
	struct iorpc_cache_ent  cache[IORPC_CACHE];
	uint64_t                clock;
	uint64_t                next_id;
	struct iorpc_call       calls[IORPC_SLOTS];
};

int iorpc_create_qp(struct iorpc_conn *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.sq_sig_all = 1;
	attr.cap.max_send_wr = IORPC_SLOTS;
	attr.cap.max_recv_wr = IORPC_SLOTS;
	attr.cap.max_send_sge = IORPC_MAX_IOV + 1; // BUG: rdma-queue-cap-unchecked -- 17 send SGEs, never compared with the device's max_sge
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

/* header of call slot i; the slot's group is registered on first use and kept */
static struct iorpc_hdr *iorpc_hdr(struct iorpc_conn *c, unsigned int i, uint32_t *lkey)
{
	unsigned int g = i / IORPC_SLOTS_PER_GRP;

	if (!c->hdr_mr[g]) {
		c->hdr_grp[g] = calloc(IORPC_SLOTS_PER_GRP, sizeof(struct iorpc_hdr));
		if (!c->hdr_grp[g])
			return NULL;
		/* OK: rdma-registration-in-datapath -- registered on first use of the group, kept by the connection */
		c->hdr_mr[g] = ibv_reg_mr(c->pd, c->hdr_grp[g],
					  IORPC_SLOTS_PER_GRP * sizeof(struct iorpc_hdr), 0);
		if (!c->hdr_mr[g]) {
			free(c->hdr_grp[g]);
			c->hdr_grp[g] = NULL;
			return NULL;
		}
	}
	*lkey = c->hdr_mr[g]->lkey;
	return &c->hdr_grp[g][i % IORPC_SLOTS_PER_GRP];
}

static struct iorpc_cache_ent *iorpc_cache_get(struct iorpc_conn *c, const void *buf, size_t len)
{
	struct iorpc_cache_ent *e, *victim = NULL;
	unsigned int i;

	for (i = 0; i < IORPC_CACHE; i++) {
		e = &c->cache[i];
		if (e->mr && e->buf == buf && e->len >= len) {
			e->stamp = ++c->clock;
			e->refs++;
			return e;
		}
		if (e->refs)
			continue;	/* a SEND in flight still uses its lkey */
		if (!victim || !e->mr || (victim->mr && e->stamp < victim->stamp))
			victim = e;
	}
	if (!victim)
		return NULL;
	if (victim->mr)
		ibv_dereg_mr(victim->mr); // OK: rdma-registration-in-datapath -- eviction from a bounded cache, only on a miss
	/* OK: rdma-registration-in-datapath -- registered only on a cache miss */
	victim->mr = ibv_reg_mr(c->pd, (void *)buf, len, 0);
	victim->buf = victim->mr ? buf : NULL;
	victim->len = len;
	victim->stamp = ++c->clock;
	if (!victim->mr)
		return NULL;
	victim->refs = 1;
	return victim;
}

static struct iorpc_call *iorpc_get_call(struct iorpc_conn *c, unsigned int *slot)
{
	unsigned int i;

	for (i = 0; i < IORPC_SLOTS; i++)
		if (!c->calls[i].busy) {
			c->calls[i].busy = true;
			c->calls[i].niov = 0;
			c->calls[i].ent = NULL;
			*slot = i;
			return &c->calls[i];
		}
	return NULL;
}

static int iorpc_post(struct iorpc_conn *c, unsigned int slot, struct ibv_sge *sge, int nsge)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = slot;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	return ibv_post_send(c->qp, &wr, &bad);
}

int iorpc_call(struct iorpc_conn *c, uint32_t proc, const void *buf, uint32_t len,
	       void (*cb)(void *, int), void *arg)
{
	struct iorpc_call *call;
	struct iorpc_hdr *h;
	struct ibv_sge sge[2];
	struct iorpc_cache_ent *ent;
	unsigned int slot;

	call = iorpc_get_call(c, &slot);
	if (!call)
		return -EAGAIN;
	h = iorpc_hdr(c, slot, &sge[0].lkey);
	ent = h ? iorpc_cache_get(c, buf, len) : NULL;
	if (!ent) {
		call->busy = false;
		return -ENOMEM;
	}
	call->ent = ent;
	call->id = c->next_id++;
	call->cb = cb;
	call->arg = arg;
	h->call_id = call->id;
	h->proc = proc;
	h->len = len;
	sge[0].addr = (uintptr_t)h;
	sge[0].length = sizeof(*h);
	sge[1].addr = (uintptr_t)buf;
	sge[1].length = len;
	sge[1].lkey = ent->mr->lkey;
	if (iorpc_post(c, slot, sge, 2)) {
		ent->refs--;
		call->ent = NULL;
		call->busy = false;
		return -EIO;
	}
	return 0;
}

static int iorpc_map_iov(struct iorpc_conn *c, struct iorpc_call *call,
			 const struct iovec *iov, int n, struct ibv_sge *sge)
{
	int i;

	for (i = 0; i < n; i++) {
		// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- every payload element is registered on every vectored call
		call->iov_mr[i] = ibv_reg_mr(c->pd, iov[i].iov_base, iov[i].iov_len, 0);
		if (!call->iov_mr[i])
			goto unwind;
		sge[i].addr = (uintptr_t)iov[i].iov_base;
		sge[i].length = (uint32_t)iov[i].iov_len;
		sge[i].lkey = call->iov_mr[i]->lkey;
	}
	call->niov = n;
	return 0;

unwind:
	/* OK: rdma-mr-leak -- every element registered before the failure is released */
	while (i--)
		ibv_dereg_mr(call->iov_mr[i]); // BUG: rdma-registration-in-datapath -- per-call deregistration (failure path of the vectored call)
	return -ENOMEM;
}

static void iorpc_unmap_iov(struct iorpc_call *call)
{
	int i;

	for (i = 0; i < call->niov; i++)
		ibv_dereg_mr(call->iov_mr[i]); // BUG: rdma-registration-in-datapath -- the payload vector is deregistered after every vectored call
	call->niov = 0;
}

int iorpc_callv(struct iorpc_conn *c, uint32_t proc, const struct iovec *iov, int n,
		void (*cb)(void *, int), void *arg)
{
	struct ibv_sge sge[IORPC_MAX_IOV + 1];
	struct iorpc_call *call;
	struct iorpc_hdr *h;
	unsigned int slot;
	uint32_t len = 0;
	int i;

	if (n < 1 || n > IORPC_MAX_IOV)
		return -EINVAL;
	call = iorpc_get_call(c, &slot);
	if (!call)
		return -EAGAIN;
	h = iorpc_hdr(c, slot, &sge[0].lkey);
	if (!h || iorpc_map_iov(c, call, iov, n, &sge[1])) {
		call->busy = false;
		return -ENOMEM;
	}
	for (i = 0; i < n; i++)
		len += (uint32_t)iov[i].iov_len;
	call->id = c->next_id++;
	call->cb = cb;
	call->arg = arg;
	h->call_id = call->id;
	h->proc = proc;
	h->len = len;
	sge[0].addr = (uintptr_t)h;
	sge[0].length = sizeof(*h);
	if (iorpc_post(c, slot, sge, n + 1)) {
		iorpc_unmap_iov(call);
		call->busy = false;
		return -EIO;
	}
	return 0;
}

int iorpc_poll(struct iorpc_conn *c)
{
	struct ibv_wc wc[16];
	int n, k;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (k = 0; k < n; k++) {
		struct iorpc_call *call;

		if (wc[k].opcode == IBV_WC_RECV || wc[k].wr_id >= IORPC_SLOTS)
			continue;	/* replies are matched by the reply path */
		call = &c->calls[wc[k].wr_id];
		if (call->niov)
			iorpc_unmap_iov(call);
		if (call->ent) {
			call->ent->refs--;
			call->ent = NULL;
		}
		call->cb(call->arg, wc[k].status == IBV_WC_SUCCESS ? 0 : -EIO);
		call->busy = false;
	}
	return n;
}

void iorpc_destroy(struct iorpc_conn *c)
{
	unsigned int i;

	ibv_destroy_qp(c->qp);
	for (i = 0; i < IORPC_CACHE; i++)
		if (c->cache[i].mr)
			ibv_dereg_mr(c->cache[i].mr);
	for (i = 0; i < IORPC_NGRP; i++) {
		if (!c->hdr_mr[i])
			continue;
		ibv_dereg_mr(c->hdr_mr[i]);
		free(c->hdr_grp[i]);
	}
}
