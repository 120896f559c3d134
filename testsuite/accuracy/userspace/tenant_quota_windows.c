/*
 * tqs: tenant quota service.  Tenants reach the service through a tenant
 * gateway connected over one RC QP.  Each tenant gets a slot: a chunk of
 * the service's arena exposed through the slot's type-2 window (allocated
 * once per slot at start-up), and a GRANT message carrying (va, rkey, len)
 * that the gateway acknowledges.  Tenants then RDMA-READ/WRITE their
 * chunk.  A tenant that outgrows its chunk is migrated to a larger one;
 * a detaching tenant's window is invalidated and its chunk goes back to
 * the arena allocator.
 *
 * Correct: detach posts a signaled LOCAL_INV and polls for it before the
 * chunk and the slot are recycled; migration binds under a key rotated
 * with ibv_inc_rkey(); when the gateway connection is lost the windows are
 * deallocated (which kills their keys) before anything is recycled; the
 * window allocation loop is unwound on failure.
 *
 * Not correct: attach re-binds a recycled slot with the key its previous
 * tenant was given; a GRANT that is not acknowledged in time recycles the
 * slot and its chunk with the window still bound; migration returns the
 * old chunk to the allocator right after posting the (unsignaled)
 * LOCAL_INV of the old key.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TQS_SLOTS	64
#define TQS_SQ_WRS	512
#define TQS_CHUNK	(1u << 20)
#define TQS_CHUNKS	256

enum tqs_state { TQS_FREE, TQS_WAIT_ACK, TQS_ACTIVE };

struct tqs_grant {
	uint64_t tenant;
	uint64_t va;
	uint32_t rkey;
	uint32_t len;
};

struct tqs_slot {
	struct tqs_slot  *next;
	enum tqs_state    state;
	struct ibv_mw    *mw;
	uint32_t          key;
	char             *mem;
	uint32_t          nchunks;
	uint64_t          tenant;
	time_t            deadline;
	struct tqs_grant  grant;
};

struct tqs {
	struct ibv_pd   *pd;
	struct ibv_cq   *cq;
	struct ibv_qp   *qp;		/* to the tenant gateway */
	struct ibv_mr   *arena_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr   *msg_mr;	/* covers slots[] */
	char            *arena;
	unsigned char    used[TQS_CHUNKS];
	struct tqs_slot  slots[TQS_SLOTS];
	struct tqs_slot *free;
};

int tqs_create_qp(struct tqs *t)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = t->cq,
		.recv_cq = t->cq,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
		.cap = {
			.max_send_wr = TQS_SQ_WRS,
			.max_recv_wr = TQS_SLOTS,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};

	t->qp = ibv_create_qp(t->pd, &attr);
	return t->qp ? 0 : -errno;
}

static char *tqs_mem_get(struct tqs *t, uint32_t n)
{
	uint32_t i, k;

	for (i = 0; i + n <= TQS_CHUNKS; i++) {
		for (k = 0; k < n && !t->used[i + k]; k++)
			;
		if (k == n) {
			memset(&t->used[i], 1, n);
			return t->arena + (size_t)i * TQS_CHUNK;
		}
	}
	return NULL;
}

static void tqs_mem_put(struct tqs *t, char *mem, uint32_t n)
{
	memset(&t->used[(mem - t->arena) / TQS_CHUNK], 0, n);
}

static void tqs_slot_put(struct tqs *t, struct tqs_slot *s)
{
	tqs_mem_put(t, s->mem, s->nchunks);
	s->mem = NULL;
	s->state = TQS_FREE;
	s->next = t->free;
	t->free = s;
}

int tqs_slots_init(struct tqs *t)
{
	int i, j;

	for (i = 0; i < TQS_SLOTS; i++) {
		t->slots[i].mw = ibv_alloc_mw(t->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- one window per tenant slot, managed by the ULP
		if (!t->slots[i].mw)
			goto err;
		t->slots[i].key = t->slots[i].mw->rkey;
		t->slots[i].state = TQS_FREE;
		t->slots[i].next = t->free;
		t->free = &t->slots[i];
	}
	return 0;
err:
	/* OK: rdma-mr-leak -- every window allocated so far is deallocated */
	for (j = 0; j < i; j++)
		ibv_dealloc_mw(t->slots[j].mw);
	t->free = NULL;
	return -ENOMEM;
}

static int tqs_post_bind_grant(struct tqs *t, struct tqs_slot *s, struct ibv_send_wr *first,
			       struct ibv_send_wr *bind)
{
	struct ibv_send_wr grant, *bad;
	struct ibv_sge sge;

	s->grant.tenant = htobe64(s->tenant);
	s->grant.va = htobe64((uintptr_t)s->mem);
	s->grant.rkey = htobe32(s->key);
	s->grant.len = htobe32(s->nchunks * TQS_CHUNK);
	sge.addr = (uintptr_t)&s->grant;
	sge.length = sizeof(s->grant);
	sge.lkey = t->msg_mr->lkey;

	memset(&grant, 0, sizeof(grant));
	grant.wr_id = (uintptr_t)s;
	grant.opcode = IBV_WR_SEND;
	grant.send_flags = IBV_SEND_SIGNALED;
	grant.sg_list = &sge;
	grant.num_sge = 1;
	bind->next = &grant;
	if (ibv_post_send(t->qp, first, &bad))
		return bad == first ? -EAGAIN : -EIO;
	return 0;
}

int tqs_attach(struct tqs *t, uint64_t tenant, uint32_t nchunks)
{
	struct ibv_send_wr bind;
	struct tqs_slot *s = t->free;
	int ret;

	if (!s)
		return -EBUSY;
	s->mem = tqs_mem_get(t, nchunks);
	if (!s->mem)
		return -ENOMEM;
	t->free = s->next;
	s->nchunks = nchunks;
	s->tenant = tenant;

	memset(&bind, 0, sizeof(bind));
	bind.wr_id = (uintptr_t)s;
	bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds the tenant's window
	bind.bind_mw.mw = s->mw;
	bind.bind_mw.rkey = s->key; // BUG: rdma-rkey-reuse -- a recycled slot is bound under the key its previous tenant was granted
	bind.bind_mw.bind_info.mr = t->arena_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)s->mem;
	bind.bind_mw.bind_info.length = (uint64_t)nchunks * TQS_CHUNK;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	ret = tqs_post_bind_grant(t, s, &bind, &bind);
	if (ret == -EAGAIN) {
		tqs_slot_put(t, s);	/* nothing posted: the QP refused the whole chain */
		return ret;
	}
	if (ret) {
		s->state = TQS_ACTIVE;	/* partly posted: the slot stays out until tqs_gateway_lost() */
		return ret;
	}
	s->state = TQS_WAIT_ACK;
	s->deadline = time(NULL) + 2;
	return 0;
}

void tqs_ack_timeout(struct tqs *t)
{
	time_t now = time(NULL);
	unsigned int i;

	for (i = 0; i < TQS_SLOTS; i++) {
		struct tqs_slot *s = &t->slots[i];

		if (s->state != TQS_WAIT_ACK || s->deadline > now)
			continue;
		/* the gateway never confirmed the grant: give the slot back */
		tqs_slot_put(t, s); // BUG: rdma-invalidation-leak -- the GRANT (with the key) may have reached the gateway; the window stays bound over the recycled chunk
	}
}

static int tqs_wait(struct tqs *t, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(t->cq, 1, &wc);
		if (n < 0)
			return -EIO;
	} while (n == 0 || wc.wr_id != wr_id);
	return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
}

int tqs_detach(struct tqs *t, struct tqs_slot *s)
{
	struct ibv_send_wr inv, *bad;

	memset(&inv, 0, sizeof(inv));
	inv.wr_id = (uintptr_t)s | 1;
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = s->key;
	inv.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(t->qp, &inv, &bad) || tqs_wait(t, inv.wr_id))
		return -EIO;	/* the connection is lost: tqs_gateway_lost() cleans up */
	tqs_slot_put(t, s); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV was polled for
	return 0;
}

int tqs_migrate(struct tqs *t, struct tqs_slot *s, uint32_t nchunks)
{
	struct ibv_send_wr inv, bind;
	char *old = s->mem;
	uint32_t old_n = s->nchunks;
	char *mem;

	mem = tqs_mem_get(t, nchunks);
	if (!mem)
		return -ENOMEM;

	memset(&inv, 0, sizeof(inv));
	inv.wr_id = (uintptr_t)s | 1;
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = s->key;
	inv.next = &bind;

	s->key = ibv_inc_rkey(s->key);
	s->mem = mem;
	s->nchunks = nchunks;
	memset(&bind, 0, sizeof(bind));
	bind.wr_id = (uintptr_t)s;
	bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds the migrated window
	bind.bind_mw.mw = s->mw;
	/* OK: rdma-rkey-reuse -- the key was rotated with ibv_inc_rkey() above */
	bind.bind_mw.rkey = s->key;
	bind.bind_mw.bind_info.mr = t->arena_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)mem;
	bind.bind_mw.bind_info.length = (uint64_t)nchunks * TQS_CHUNK;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	memcpy(mem, old, (size_t)old_n * TQS_CHUNK);
	if (tqs_post_bind_grant(t, s, &inv, &bind))
		return -EIO;
	tqs_mem_put(t, old, old_n); // BUG: rdma-unmap-before-invalidate -- the old chunk is recycled right after posting the unsignaled LOCAL_INV of the old key
	return 0;
}

/* the gateway QP went to error: nothing can be posted any more */
void tqs_gateway_lost(struct tqs *t)
{
	unsigned int i;

	for (i = 0; i < TQS_SLOTS; i++) {
		struct tqs_slot *s = &t->slots[i];

		if (s->state == TQS_FREE)
			continue;
		ibv_dealloc_mw(s->mw);
		s->mw = ibv_alloc_mw(t->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- replacement window allocated by the ULP
		if (!s->mw) {
			/* retire the slot: chunk back, slot off the free list */
			tqs_mem_put(t, s->mem, s->nchunks);
			s->mem = NULL;
			s->state = TQS_FREE;
			continue;
		}
		s->key = s->mw->rkey;
		tqs_slot_put(t, s); // OK: rdma-invalidation-leak -- the old window was deallocated (its key is dead) before the chunk is recycled
	}
}
