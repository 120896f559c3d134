// RUN: %check_ulplint %s rdma-rkey-reuse %t
// RUN: %check_ulplint --mode=plugin %s rdma-rkey-reuse %t.plugin

// A page server grants pages through type-2 windows. One helper builds and
// posts every bind with the key its caller chooses, so each call is judged
// on the key it passes: a grant and an upgrade rotate it; a downgrade that
// keeps the key of the writable grant, and a refresh that rotates once
// outside its loop, hand a peer that kept the old rkey the re-bound page.
// A wrapper that passes its own parameter on is judged at its callers.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

#define PG_SIZE 4096

struct pg_frame {
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	void *mem;
	uint32_t key;
};

struct pg_home {
	struct ibv_qp *qp;
	uint64_t wrid;
};

static int pg_post_bind(struct pg_home *h, struct pg_frame *f, uint32_t rkey,
			unsigned int access)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = ++h->wrid;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = f->mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = f->mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)f->mem;
	wr.bind_mw.bind_info.length = PG_SIZE;
	wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(h->qp, &wr, &bad);
}

static int pg_rebind(struct pg_home *h, struct pg_frame *f, uint32_t key)
{
	return pg_post_bind(h, f, key, IBV_ACCESS_REMOTE_READ);
}

int pg_grant(struct pg_home *h, struct pg_frame *f)
{
	f->key = ibv_inc_rkey(f->key);
	return pg_post_bind(h, f, f->key, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
}

int pg_upgrade(struct pg_home *h, struct pg_frame *f)
{
	uint32_t key = ibv_inc_rkey(f->key);

	if (pg_post_bind(h, f, key, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE))
		return -1;
	f->key = key;
	return 0;
}

int pg_downgrade(struct pg_home *h, struct pg_frame *f)
{
	/* readers that cached the key keep working */
	return pg_post_bind(h, f, f->key, IBV_ACCESS_REMOTE_READ);
	// CHECK-MESSAGES: :[[@LINE-1]]:28: warning: memory window re-bound by 'pg_post_bind' with the key passed here, which is not a new one; a peer holding the old rkey keeps access to the re-bound memory [rdma-rkey-reuse]
	// CHECK-MESSAGES: :39:20: note: the window is bound with that key here
}

int pg_refresh_all(struct pg_home *h, struct pg_frame *frames, int n)
{
	uint32_t key = ibv_inc_rkey(frames[0].key);
	int i;

	for (i = 0; i < n; i++)
		if (pg_post_bind(h, &frames[i], key, IBV_ACCESS_REMOTE_READ))
		// CHECK-MESSAGES: :[[@LINE-1]]:35: warning: memory window re-bound by 'pg_post_bind' with the key passed here, which is not a new one; a peer holding the old rkey keeps access to the re-bound memory [rdma-rkey-reuse]
		// CHECK-MESSAGES: :39:20: note: the window is bound with that key here
			return -1;
	return 0;
}

int pg_move(struct pg_home *h, struct pg_frame *f, void *mem)
{
	f->mem = mem;
	return pg_rebind(h, f, ibv_inc_rkey(f->key));
}

int pg_restore(struct pg_home *h, struct pg_frame *f, uint32_t saved)
{
	return pg_rebind(h, f, saved);
	// CHECK-MESSAGES: :[[@LINE-1]]:25: warning: memory window re-bound by 'pg_rebind' with the key passed here, which is not a new one; a peer holding the old rkey keeps access to the re-bound memory [rdma-rkey-reuse]
	// CHECK-MESSAGES: :39:20: note: the window is bound with that key here
}

/* Near miss: a frame's first grant binds its new window under the
 * allocation key, which no peer has seen. */
int pg_frame_open(struct ibv_pd *pd, struct pg_home *h, struct pg_frame *f)
{
	f->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	if (!f->mw)
		return -1;
	return pg_post_bind(h, f, f->mw->rkey, IBV_ACCESS_REMOTE_READ);
}

/* A later grant under the same key re-exposes the frame to whoever kept it. */
int pg_frame_regrant(struct pg_home *h, struct pg_frame *f)
{
	return pg_post_bind(h, f, f->mw->rkey, IBV_ACCESS_REMOTE_READ);
	// CHECK-MESSAGES: :[[@LINE-1]]:28: warning: memory window re-bound by 'pg_post_bind' with the key passed here, which is not a new one; a peer holding the old rkey keeps access to the re-bound memory [rdma-rkey-reuse]
	// CHECK-MESSAGES: :39:20: note: the window is bound with that key here
}
