/*
 * ra_kvs_lease_server.c -- one-sided read key/value server over rdma_cm.
 *
 * Values live in one arena registered at startup for local access and
 * window binding only.  A client that wants to read a value asks for a
 * lease: the server binds a type-2 memory window over the value's slot with
 * REMOTE_READ and returns the window's rkey in a LEASE_GRANT message.  The
 * client RDMA-READs the value and sends LEASE_DROP; the server then posts a
 * signaled LOCAL_INV and recycles the lease from that completion.  Leases
 * expire after KVS_LEASE_SECS; deleting a key revokes its leases.
 *
 * Right: the grant path (fresh key per bind), the drop path (lease recycled
 * from the successful LOCAL_INV completion), client teardown (windows are
 * deallocated, which kills their keys).
 * Wrong: the expiry reaper recycles bound leases without invalidating them;
 * key deletion hands the value slot back to the allocator while the
 * LOCAL_INVs of its windows are still in flight; lease renewal rebinds the
 * window under the key the client already has; client setup leaks the
 * message-ring registration when the receive ring cannot be posted.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-local-mr-management,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked
 *   -- not reviewed in this file
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define KVS_MAX_CLIENTS	64
#define KVS_LEASES	32
#define KVS_RECV_DEPTH	32
#define KVS_SEND_SLOTS	16
#define KVS_NMSGS	(KVS_RECV_DEPTH + KVS_SEND_SLOTS)
#define KVS_ARENA_SIZE	(64UL << 20)
#define KVS_SLOT_SIZE	4096UL
#define KVS_LEASE_SECS	5
#define KVS_NBUCKETS	1024

enum { KVS_LEASE_REQ = 1, KVS_LEASE_GRANT, KVS_LEASE_DROP, KVS_LEASE_RENEW,
       KVS_LEASE_DENY, KVS_DELETE };

/* low two bits of wr_id say what the work request was */
enum { WR_RECV = 0, WR_SEND = 1, WR_INV = 2, WR_BIND = 3 };
#define WRID(p, t)	((uint64_t)(uintptr_t)(p) | (uint64_t)(t))
#define WRID_PTR(w)	((void *)(uintptr_t)((w) & ~3ULL))
#define WRID_TAG(w)	((int)((w) & 3))

struct kvs_msg {
	uint32_t type, lease_id;
	uint64_t key, addr;
	uint32_t rkey, len;
} __attribute__((aligned(64)));

struct kvs_slot { struct kvs_slot *next; };

struct kvs_entry {
	struct kvs_entry *hnext;
	uint64_t key;
	void *val;
	uint32_t len;
	int nleases;
};

struct kvs_client;

struct kvs_lease {
	struct kvs_lease *next;		/* client's free list */
	struct kvs_client *cl;
	struct kvs_entry *ent;
	struct ibv_mw *mw;
	uint32_t rkey;			/* key of the current binding */
	uint32_t id;
	int bound;
	time_t expires;
};

struct kvs_client {
	struct rdma_cm_id *id;
	struct ibv_mr *msg_mr;
	struct kvs_msg *msgs;		/* KVS_RECV_DEPTH recvs, then sends */
	unsigned int send_head;
	struct kvs_lease leases[KVS_LEASES];
	struct kvs_lease *free_leases;
	int in_use;
};

static struct kvs_client g_clients[KVS_MAX_CLIENTS];
static struct kvs_entry *g_table[KVS_NBUCKETS];
static struct ibv_pd *g_pd;
static struct ibv_cq *g_cq;
static struct ibv_mr *g_arena_mr;
static struct kvs_slot *g_free_slots;

static void slot_put(void *p)
{
	struct kvs_slot *s = p;

	s->next = g_free_slots;
	g_free_slots = s;
}

static void *slot_get(void)
{
	struct kvs_slot *s = g_free_slots;

	if (s)
		g_free_slots = s->next;
	return s;
}

static void lease_put(struct kvs_client *cl, struct kvs_lease *l)
{
	if (l->ent)
		l->ent->nleases--;
	l->ent = NULL;
	l->bound = 0;
	l->next = cl->free_leases;
	cl->free_leases = l;
}

static struct kvs_entry *kvs_lookup(uint64_t key)
{
	struct kvs_entry *e = g_table[key % KVS_NBUCKETS];

	while (e && e->key != key)
		e = e->hnext;
	return e;
}

/* Insert a value; called by the loader before clients connect. */
int kvs_put(uint64_t key, const void *val, uint32_t len)
{
	struct kvs_entry *e;

	if (len > KVS_SLOT_SIZE || kvs_lookup(key) || !(e = calloc(1, sizeof(*e))))
		return -EINVAL;
	e->val = slot_get();
	if (!e->val) {
		free(e);
		return -ENOSPC;
	}
	memcpy(e->val, val, len);
	e->key = key;
	e->len = len;
	e->hnext = g_table[key % KVS_NBUCKETS];
	g_table[key % KVS_NBUCKETS] = e;
	return 0;
}

static int post_msg(struct kvs_client *cl, struct ibv_send_wr *first,
		    struct ibv_send_wr *wr, struct ibv_sge *sge, uint32_t type,
		    struct kvs_lease *l)
{
	struct kvs_msg *m = &cl->msgs[KVS_RECV_DEPTH + cl->send_head];
	struct ibv_send_wr *bad;

	cl->send_head = (cl->send_head + 1) % KVS_SEND_SLOTS;
	memset(m, 0, sizeof(*m));
	m->type = type;
	if (l && l->ent) {
		m->lease_id = l->id;
		m->key = l->ent->key;
		m->addr = (uintptr_t)l->ent->val;
		m->len = l->ent->len;
		m->rkey = l->rkey;
	}
	sge->addr = (uintptr_t)m;
	sge->length = sizeof(*m);
	sge->lkey = cl->msg_mr->lkey;
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = WRID(cl, WR_SEND);
	wr->opcode = IBV_WR_SEND;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(cl->id->qp, first ? first : wr, &bad);
}

static void build_bind(struct ibv_send_wr *wr, struct kvs_lease *l, uint32_t rkey)
{
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = WRID(l, WR_BIND);
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = l->mw;
	wr->bind_mw.rkey = rkey;
	wr->bind_mw.bind_info.mr = g_arena_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)l->ent->val;
	wr->bind_mw.bind_info.length = l->ent->len;
	wr->bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
}

static int lease_grant(struct kvs_client *cl, uint64_t key)
{
	struct kvs_entry *e = kvs_lookup(key);
	struct ibv_send_wr bind_wr, send_wr;
	struct ibv_sge sge;
	struct kvs_lease *l = cl->free_leases;

	if (!e || !l)
		return post_msg(cl, NULL, &send_wr, &sge, KVS_LEASE_DENY, NULL);
	cl->free_leases = l->next;

	l->ent = e;
	e->nleases++;
	l->rkey = ibv_inc_rkey(l->rkey);
	build_bind(&bind_wr, l, l->rkey);	// OK: rdma-rkey-reuse -- the key was rotated for this grant
	bind_wr.next = &send_wr;
	if (post_msg(cl, &bind_wr, &send_wr, &sge, KVS_LEASE_GRANT, l)) {
		lease_put(cl, l);	// OK: rdma-invalidation-leak -- the post failed, the window was never bound
		return -EIO;
	}
	l->bound = 1;
	l->expires = time(NULL) + KVS_LEASE_SECS;
	return 0;
}

/* Extend a lease and re-key it so that a copied key stops working. */
static int lease_renew(struct kvs_client *cl, struct kvs_lease *l)
{
	struct ibv_send_wr inv_wr, bind_wr, send_wr;
	struct ibv_sge sge;

	memset(&inv_wr, 0, sizeof(inv_wr));
	inv_wr.wr_id = WRID(l, WR_BIND);
	inv_wr.opcode = IBV_WR_LOCAL_INV;
	inv_wr.invalidate_rkey = l->rkey;
	inv_wr.next = &bind_wr;
	build_bind(&bind_wr, l, l->rkey);	// BUG: rdma-rkey-reuse -- rebinds the window under the key the client (and whoever copied it) already holds
	bind_wr.next = &send_wr;
	if (post_msg(cl, &inv_wr, &send_wr, &sge, KVS_LEASE_GRANT, l))
		return -EIO;
	l->expires = time(NULL) + KVS_LEASE_SECS;
	return 0;
}

static int lease_drop(struct kvs_client *cl, struct kvs_lease *l)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(l, WR_INV);
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = l->rkey;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(cl->id->qp, &wr, &bad);
}

/* Revoke every lease on the key, then drop the value. */
static int kvs_delete(uint64_t key)
{
	struct kvs_entry **pp = &g_table[key % KVS_NBUCKETS], *e;
	int c, i;

	for (e = *pp; e && e->key != key; pp = &e->hnext, e = *pp)
		;
	if (!e)
		return -ENOENT;

	for (c = 0; c < KVS_MAX_CLIENTS && e->nleases; c++) {
		struct kvs_client *cl = &g_clients[c];

		for (i = 0; cl->in_use && i < KVS_LEASES; i++) {
			struct kvs_lease *l = &cl->leases[i];

			if (!l->bound || l->ent != e)
				continue;
			if (lease_drop(cl, l))
				return -EAGAIN;		/* entry stays; retried later */
			e->nleases--;
			l->ent = NULL;
		}
	}
	*pp = e->hnext;
	/* OK: rdma-invalidation-leak -- every window over the value had its LOCAL_INV posted */
	slot_put(e->val);	// BUG: rdma-unmap-before-invalidate -- the value slot goes back to the allocator while the LOCAL_INVs of the windows over it are still in flight
	free(e);
	return 0;
}

static void lease_reap(time_t now)
{
	int c, i;

	for (c = 0; c < KVS_MAX_CLIENTS; c++) {
		struct kvs_client *cl = &g_clients[c];

		for (i = 0; cl->in_use && i < KVS_LEASES; i++) {
			struct kvs_lease *l = &cl->leases[i];

			if (!l->bound || l->expires > now)
				continue;
			fprintf(stderr, "kvs: lease %u of client %d expired\n", l->id, c);
			lease_put(cl, l);	// BUG: rdma-invalidation-leak -- the expired lease is recycled with its window still bound; the old rkey keeps reading the slot
		}
	}
}

static int post_recv(struct kvs_client *cl, struct ibv_mr *mr, int i)
{
	struct ibv_sge sge = { (uintptr_t)&cl->msgs[i], sizeof(struct kvs_msg), mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WRID(&cl->msgs[i], WR_RECV),
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(cl->id->qp, &wr, &bad);
}

static int client_alloc_leases(struct kvs_client *cl)
{
	int i;

	cl->free_leases = NULL;
	for (i = 0; i < KVS_LEASES; i++) {
		struct kvs_lease *l = &cl->leases[i];

		l->mw = ibv_alloc_mw(g_pd, IBV_MW_TYPE_2);
		if (!l->mw)
			goto unwind;
		l->rkey = l->mw->rkey;
		l->id = i;
		l->cl = cl;
		l->next = cl->free_leases;
		cl->free_leases = l;
	}
	return 0;

unwind:
	while (i--) {		// OK: rdma-mr-leak -- the failed iteration holds no window; every earlier one is deallocated
		ibv_dealloc_mw(cl->leases[i].mw);
		cl->leases[i].mw = NULL;
	}
	return -ENOMEM;
}

static int client_setup(struct kvs_client *cl, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = g_cq, .recv_cq = g_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = KVS_SEND_SLOTS * 3, .max_recv_wr = KVS_RECV_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct kvs_msg *msgs;
	struct ibv_mr *mr;
	int i;

	msgs = calloc(KVS_NMSGS, sizeof(*msgs));
	if (!msgs)
		return -ENOMEM;
	mr = ibv_reg_mr(g_pd, msgs, KVS_NMSGS * sizeof(*msgs), IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		free(msgs);
		return -ENOMEM;
	}
	if (rdma_create_qp(id, g_pd, &qa))
		goto err_mr;	// OK: rdma-mr-leak -- err_mr deregisters the ring

	cl->id = id;
	cl->msgs = msgs;
	cl->send_head = 0;
	id->context = cl;
	for (i = 0; i < KVS_RECV_DEPTH; i++) {
		if (post_recv(cl, mr, i)) {
			rdma_destroy_qp(id);
			free(msgs);	// OK: rdma-invalidation-leak -- local-only registration, no key went out
			return -EIO;	// BUG: rdma-mr-leak -- the message-ring MR is neither deregistered nor stored anywhere
		}
	}
	if (client_alloc_leases(cl))
		goto err_qp;
	cl->msg_mr = mr;
	cl->in_use = 1;
	return 0;

err_qp:
	rdma_destroy_qp(id);
err_mr:
	ibv_dereg_mr(mr);
	free(msgs);
	return -ENOMEM;
}

static void client_teardown(struct kvs_client *cl)
{
	int i;

	for (i = 0; i < KVS_LEASES; i++) {
		struct kvs_lease *l = &cl->leases[i];

		if (l->ent)
			l->ent->nleases--;
		ibv_dealloc_mw(l->mw);	// OK: rdma-invalidation-leak -- deallocating the window invalidates its key
	}
	rdma_destroy_qp(cl->id);
	ibv_dereg_mr(cl->msg_mr);
	free(cl->msgs);
	memset(cl, 0, sizeof(*cl));
}

static void handle_recv(struct kvs_client *cl, struct kvs_msg *msg)
{
	struct kvs_lease *l = msg->lease_id < KVS_LEASES ? &cl->leases[msg->lease_id] : NULL;
	int err = 0;

	if (msg->type == KVS_LEASE_REQ)
		err = lease_grant(cl, msg->key);
	else if (msg->type == KVS_LEASE_DROP && l && l->bound)
		err = lease_drop(cl, l);
	else if (msg->type == KVS_LEASE_RENEW && l && l->bound)
		err = lease_renew(cl, l);
	else if (msg->type == KVS_DELETE)
		kvs_delete(msg->key);
	if (err || post_recv(cl, cl->msg_mr, (int)(msg - cl->msgs)))
		rdma_disconnect(cl->id);
}

static void poll_cq_once(void)
{
	struct ibv_wc wc[16];
	int n, k, c;

	n = ibv_poll_cq(g_cq, 16, wc);
	for (k = 0; k < n; k++) {
		void *p = WRID_PTR(wc[k].wr_id);

		if (WRID_TAG(wc[k].wr_id) == WR_RECV && wc[k].status == IBV_WC_SUCCESS) {
			for (c = 0; c < KVS_MAX_CLIENTS; c++)
				if (g_clients[c].in_use &&
				    g_clients[c].id->qp->qp_num == wc[k].qp_num)
					handle_recv(&g_clients[c], p);
		} else if (WRID_TAG(wc[k].wr_id) == WR_INV) {
			struct kvs_lease *l = p;

			if (wc[k].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "kvs: LOCAL_INV failed: %s\n",
					ibv_wc_status_str(wc[k].status));
				rdma_disconnect(l->cl->id);
				continue;
			}
			lease_put(l->cl, l);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- recycled from the successful completion of its own LOCAL_INV
		}
	}
}

int main(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(20886) };
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id;
	struct rdma_cm_event *ev;
	char *arena = NULL;
	size_t off;
	int c;

	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
		return 1;
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&sin) || !listen_id->verbs ||
	    !(g_pd = ibv_alloc_pd(listen_id->verbs)) ||
	    !(g_cq = ibv_create_cq(listen_id->verbs, 4096, NULL, NULL, 0)) ||
	    !(arena = aligned_alloc(4096, KVS_ARENA_SIZE)))
		goto out;
	g_arena_mr = ibv_reg_mr(g_pd, arena, KVS_ARENA_SIZE,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!g_arena_mr || rdma_listen(listen_id, 16))
		goto out;
	for (off = KVS_ARENA_SIZE; off; off -= KVS_SLOT_SIZE)
		slot_put(arena + off - KVS_SLOT_SIZE);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);

	for (;;) {
		poll_cq_once();
		lease_reap(time(NULL));
		if (rdma_get_cm_event(ch, &ev))
			continue;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct kvs_client *cl = NULL;

			for (c = 0; c < KVS_MAX_CLIENTS && !cl; c++)
				if (!g_clients[c].in_use)
					cl = &g_clients[c];
			if (!cl || client_setup(cl, ev->id) || rdma_accept(ev->id, NULL))
				rdma_reject(ev->id, NULL, 0);
		} else if (ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id->context) {
			client_teardown(ev->id->context);
			ev->id->context = NULL;
		}
		rdma_ack_cm_event(ev);
	}

out:
	for (c = 0; c < KVS_MAX_CLIENTS; c++)
		if (g_clients[c].in_use)
			client_teardown(&g_clients[c]);
	if (g_arena_mr)
		ibv_dereg_mr(g_arena_mr);
	free(arena);		// OK: rdma-invalidation-leak -- every client's windows were deallocated and the arena deregistered first
	if (g_cq)
		ibv_destroy_cq(g_cq);
	if (g_pd)
		ibv_dealloc_pd(g_pd);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return 1;
}
