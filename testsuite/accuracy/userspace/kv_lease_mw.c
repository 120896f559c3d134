/*
 * leasekv: a key-value server that lends objects to clients for direct
 * access.  A lease binds a type-2 window over the object (REMOTE_READ, or
 * REMOTE_READ|REMOTE_WRITE for a write lease) and returns the key; the
 * client reads or writes the object one-sidedly until it returns the
 * lease.  Returning a lease (leasekv_revoke) posts a signaled LOCAL_INV
 * and polls for its completion before the object may be freed or moved.
 *
 * Not correct: the lease reaper, which runs when a client stops renewing,
 * deletes expired objects that were marked for deletion by calling the
 * object destructor directly -- the window is still bound over the
 * object's memory, which goes back to malloc with the client's key valid.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct leasekv_obj {
	void          *data;
	size_t         len;
	struct ibv_mw *mw;
	uint32_t       key;
	bool           leased;
	bool           doomed;
	time_t         expires;
};

struct leasekv {
	struct ibv_pd  *pd;
	struct ibv_cq  *cq;
	struct ibv_qp  *qp;
	struct ibv_mr  *heap_mr;	/* object heap, LOCAL_WRITE | MW_BIND */
};

static int leasekv_wait(struct leasekv *kv, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(kv->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n && wc.wr_id == wr_id)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

int leasekv_grant(struct leasekv *kv, struct leasekv_obj *o, bool write, uint32_t *key)
{
	struct ibv_send_wr wr, *bad;

	if (!o->mw) {
		o->mw = ibv_alloc_mw(kv->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!o->mw)
			return -errno;
		o->key = o->mw->rkey;
	}
	o->key = ibv_inc_rkey(o->key);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)o;
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-lease window bind done by the ULP
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = o->mw;
	wr.bind_mw.rkey = o->key;
	wr.bind_mw.bind_info.mr = kv->heap_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)o->data;
	wr.bind_mw.bind_info.length = o->len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ |
					       (write ? IBV_ACCESS_REMOTE_WRITE : 0);
	if (ibv_post_send(kv->qp, &wr, &bad) || leasekv_wait(kv, (uintptr_t)o))
		return -EIO;
	o->leased = true;
	o->expires = time(NULL) + 10;
	*key = o->key;
	return 0;
}

int leasekv_revoke(struct leasekv *kv, struct leasekv_obj *o)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)o | 1;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = o->key;
	if (ibv_post_send(kv->qp, &wr, &bad))
		return -EIO;
	if (leasekv_wait(kv, (uintptr_t)o | 1))
		return -EIO;
	o->leased = false;
	return 0;
}

static void leasekv_obj_destroy(struct leasekv_obj *o)
{
	free(o->data);
	o->data = NULL;
}

void leasekv_delete(struct leasekv *kv, struct leasekv_obj *o)
{
	if (o->leased && leasekv_revoke(kv, o))
		return;		/* keep the object until the window is gone */
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- revoked and waited for before the memory is freed */
	leasekv_obj_destroy(o);
}

void leasekv_reap(struct leasekv *kv, struct leasekv_obj *objs, int n)
{
	time_t now = time(NULL);
	int i;

	(void)kv;
	for (i = 0; i < n; i++) {
		struct leasekv_obj *o = &objs[i];

		if (!o->leased || o->expires > now)
			continue;
		o->leased = false;
		if (o->doomed)
			leasekv_obj_destroy(o); // BUG: rdma-invalidation-leak -- the expired lease's window is still bound over the freed object
	}
}
