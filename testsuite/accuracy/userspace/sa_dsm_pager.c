/*
 * sa_dsm_pager.c - home-node pager of a page-granular distributed shared
 * memory.
 *
 * A remote node that faults on a page sends DSM_GRANT_REQ; the home picks a
 * frame from its arena, binds a type-2 memory window over it (classic
 * ibv_post_send with IBV_WR_BIND_MW) and answers with DSM_GRANT carrying the
 * window's rkey.  The remote then writes the page back with one-sided RDMA
 * WRITEs and acknowledges with DSM_ACK.  Revocation posts IBV_WR_LOCAL_INV on
 * the window.  Frames live in one arena MR (LOCAL_WRITE | MW_BIND, no remote
 * rights of its own); overflow frames get a private MR.
 *
 * Wrong: the lazy eviction recycles a frame right after posting an
 * unsignaled LOCAL_INV; a timed-out grant puts a frame whose key was sent
 * back on the free list; the read-only downgrade re-binds under the old key;
 * the overflow-frame allocator leaks its MR on one error path.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked, rdma-remote-invalidate-unchecked -- outside this review
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define DSM_PAGE	4096
#define DSM_NFRAMES	256
#define DSM_ACK_MS	500

enum dsm_op { DSM_GRANT_REQ = 1, DSM_GRANT, DSM_ACK, DSM_RELEASE, DSM_DOWNGRADE };
enum frame_state { FR_FREE, FR_RW, FR_RO };

struct dsm_msg {
	uint32_t op;
	uint32_t key;
	uint64_t gpa;
	uint64_t addr;
};

struct frame {
	void		*mem;
	struct ibv_mw	*mw;
	struct ibv_mr	*mr;		/* arena MR, or the overflow frame's own */
	uint32_t	 key;
	uint64_t	 gpa;
	int		 state;
	struct frame	*next;
};

struct home {
	struct ibv_pd	*pd;
	struct ibv_cq	*cq;
	struct ibv_qp	*qp;
	char		*arena;
	struct ibv_mr	*arena_mr;
	struct dsm_msg	*tx;
	struct ibv_mr	*tx_mr;
	struct frame	 frames[DSM_NFRAMES];
	struct frame	*free;
	uint64_t	 wrid;
};

static struct home *g_home;

#define die_if(c, ...) do { if (c) { fprintf(stderr, __VA_ARGS__); return -1; } } while (0)

static long ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Poll until the signaled WR 'id' completes; other completions are dropped
 * on the floor here, the receive side has its own CQ. */
static int wait_wr(struct home *h, uint64_t id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(h->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 0)
			continue;
		if (wc.wr_id != id)
			continue;
		return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

static int post_bind(struct home *h, struct frame *f, uint32_t rkey,
		     unsigned int access, uint64_t *id)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = *id = ++h->wrid;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = f->mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = f->mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)f->mem;
	wr.bind_mw.bind_info.length = DSM_PAGE;
	wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(h->qp, &wr, &bad);
}

static int post_inv(struct home *h, struct frame *f, int signaled, uint64_t *id)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = *id = ++h->wrid;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = f->key;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	return ibv_post_send(h->qp, &wr, &bad);
}

static int send_msg(struct home *h, uint32_t op, uint32_t key, uint64_t gpa, uint64_t addr)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	uint64_t id;

	h->tx->op = op;
	h->tx->key = key;
	h->tx->gpa = gpa;
	h->tx->addr = addr;
	sge.addr = (uintptr_t)h->tx;
	sge.length = sizeof(*h->tx);
	sge.lkey = h->tx_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id = ++h->wrid;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(h->qp, &wr, &bad))
		return -EIO;
	return wait_wr(h, id);
}

/* provided by the receive thread: 0 once DSM_ACK for gpa arrived */
extern int dsm_ack_seen(uint64_t gpa);

int dsm_grant(struct home *h, uint64_t gpa)
{
	struct frame *f = h->free;
	struct timespec t0;
	uint64_t id;

	if (!f)
		return -EBUSY;
	h->free = f->next;

	f->key = ibv_inc_rkey(f->key);
	/* OK: rdma-rkey-reuse -- every grant binds under a key rotated just above */
	if (post_bind(h, f, f->key, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &id) ||
	    wait_wr(h, id)) {
		f->next = h->free;	/* OK: rdma-invalidation-leak -- the bind failed, the window holds no key */
		h->free = f;
		return -EIO;
	}
	f->gpa = gpa;
	f->state = FR_RW;

	if (send_msg(h, DSM_GRANT, f->key, gpa, (uintptr_t)f->mem))
		return -EIO;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (dsm_ack_seen(gpa) != 0) {
		if (ms_since(&t0) > DSM_ACK_MS) {
			fprintf(stderr, "dsm: no ack for gpa %#llx\n", (unsigned long long)gpa);
			f->state = FR_FREE;
			f->next = h->free;	/* BUG: rdma-invalidation-leak -- DSM_GRANT carried the key; the window is still bound when the frame is recycled */
			h->free = f;
			return -ETIMEDOUT;
		}
	}
	return 0;
}

int dsm_downgrade(struct home *h, struct frame *f)
{
	uint64_t id;

	if (post_inv(h, f, 1, &id) || wait_wr(h, id))
		return -EIO;
	/* same key: readers that cached it keep working */
	if (post_bind(h, f, f->key, IBV_ACCESS_REMOTE_READ, &id))	/* BUG: rdma-rkey-reuse -- re-bound with the key of the writable grant */
		return -EIO;
	if (wait_wr(h, id))
		return -EIO;
	f->state = FR_RO;
	return send_msg(h, DSM_DOWNGRADE, f->key, f->gpa, (uintptr_t)f->mem);
}

/* Revoke and wait: used when the page contents must be stable right away. */
int dsm_revoke(struct home *h, struct frame *f)
{
	uint64_t id;
	int rc;

	rc = post_inv(h, f, 1, &id);
	if (rc)
		return rc;
	rc = wait_wr(h, id);
	if (rc)
		return rc;
	f->state = FR_FREE;
	f->next = h->free;	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- LOCAL_INV completed before the frame is recycled */
	h->free = f;
	return 0;
}

/* Eviction under memory pressure: do not stall the fault path. */
void dsm_evict_lazy(struct home *h, struct frame *f)
{
	uint64_t id;

	if (post_inv(h, f, 0, &id)) {
		fprintf(stderr, "dsm: LOCAL_INV post failed for frame %p\n", f->mem);
		return;
	}
	memset(f->mem, 0, DSM_PAGE);
	f->state = FR_FREE;
	f->next = h->free;	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may still be queued; the frame goes to the next fault */
	h->free = f;
}

/* Overflow frame outside the arena, used when the free list runs dry. */
struct frame *dsm_overflow_frame(struct home *h)
{
	struct frame *f;

	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	if (posix_memalign(&f->mem, DSM_PAGE, DSM_PAGE)) {
		free(f);
		return NULL;
	}
	f->mr = ibv_reg_mr(h->pd, f->mem, DSM_PAGE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!f->mr)
		goto err_mem;
	f->mw = ibv_alloc_mw(h->pd, IBV_MW_TYPE_2);
	if (!f->mw)
		goto err_mem;
	f->key = f->mw->rkey;
	return f;

err_mem:
	free(f->mem);		/* OK: rdma-invalidation-leak -- a local-only MR; no window was ever bound over the page */
	free(f);		/* BUG: rdma-mr-leak -- when ibv_alloc_mw fails f->mr is never deregistered */
	return NULL;
}

void dsm_overflow_frame_free(struct frame *f)
{
	ibv_dealloc_mw(f->mw);
	ibv_dereg_mr(f->mr);
	free(f->mem);		/* OK: rdma-invalidation-leak -- the window was deallocated first, killing its key */
	free(f);
}

int dsm_home_init(struct home *h, struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_qp *qp)
{
	int i;

	memset(h, 0, sizeof(*h));
	h->pd = pd;
	h->cq = cq;
	h->qp = qp;
	if (posix_memalign((void **)&h->arena, DSM_PAGE, (size_t)DSM_NFRAMES * DSM_PAGE))
		return -ENOMEM;
	h->arena_mr = ibv_reg_mr(pd, h->arena, (size_t)DSM_NFRAMES * DSM_PAGE,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!h->arena_mr)
		goto err_arena;
	h->tx = calloc(1, sizeof(*h->tx));
	if (!h->tx)
		goto err_arena_mr;
	h->tx_mr = ibv_reg_mr(pd, h->tx, sizeof(*h->tx), 0);
	if (!h->tx_mr)
		goto err_tx;

	for (i = 0; i < DSM_NFRAMES; i++) {
		struct frame *f = &h->frames[i];

		f->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (!f->mw)
			goto err_mw;
		f->mem = h->arena + (size_t)i * DSM_PAGE;
		f->mr = h->arena_mr;
		f->key = f->mw->rkey;
		f->state = FR_FREE;
		f->next = h->free;
		h->free = f;
	}
	g_home = h;
	return 0;

err_mw:
	while (i--)
		ibv_dealloc_mw(h->frames[i].mw);
	ibv_dereg_mr(h->tx_mr);
err_tx:
	free(h->tx);
err_arena_mr:
	ibv_dereg_mr(h->arena_mr);
err_arena:
	free(h->arena);
	return -ENOMEM;		/* OK: rdma-mr-leak -- every window allocated so far and both MRs are released above */
}

void dsm_home_fini(struct home *h)
{
	int i;

	for (i = 0; i < DSM_NFRAMES; i++)
		ibv_dealloc_mw(h->frames[i].mw);
	ibv_dereg_mr(h->arena_mr);
	free(h->arena);		/* OK: rdma-invalidation-leak -- granted windows were deallocated above, the arena MR has no remote rights */
	ibv_dereg_mr(h->tx_mr);
	free(h->tx);
	g_home = NULL;
}

int dsm_handle(struct home *h, const struct dsm_msg *m)
{
	struct frame *f;
	int i;

	if (m->op == DSM_GRANT_REQ)
		return dsm_grant(h, m->gpa);

	for (i = 0, f = NULL; i < DSM_NFRAMES; i++) {
		if (h->frames[i].state != FR_FREE && h->frames[i].gpa == m->gpa) {
			f = &h->frames[i];
			break;
		}
	}
	die_if(!f, "dsm: op %u for unknown gpa %#llx\n", m->op, (unsigned long long)m->gpa);

	switch (m->op) {
	case DSM_RELEASE:
		if (f->state == FR_RO)
			dsm_evict_lazy(h, f);
		else
			return dsm_revoke(h, f);
		return 0;
	case DSM_DOWNGRADE:
		return dsm_downgrade(h, f);
	default:
		return -EINVAL;
	}
}
