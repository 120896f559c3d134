// RUN: %check_ulplint %s rdma-invalidation-leak %t

// A parameter-server client keeps each tensor's state: EXPOSED while the
// server holds the key of the window over it. Dropping or resizing a
// tensor invalidates only when the state says the key is out, and waits:
// where the state says no key is out, none is. An expiry that dispatches
// on the kind of lease (a read lease is invalidated, a write lease is just
// dropped) is not such a guard: the write lease's key is still out.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

enum ts_state { TS_IDLE, TS_EXPOSED };
enum ts_kind { TS_READ, TS_WRITE };

struct ts_tensor {
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	void *data;
	size_t len;
	uint32_t rkey;
	enum ts_state state;
	enum ts_kind kind;
	int busy;
};

struct ts_client {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	uint64_t wrid;
};

static int ts_wait(struct ts_client *c, uint64_t id)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != id));
	return n < 0 || wc.status != IBV_WC_SUCCESS ? -1 : 0;
}

int ts_tensor_init(struct ts_client *c, struct ts_tensor *t, size_t len)
{
	t->data = malloc(len);
	if (!t->data)
		return -1;
	t->len = len;
	t->mr = ibv_reg_mr(c->pd, t->data, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!t->mr)
		goto err_data;
	t->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
	if (!t->mw)
		goto err_mr;
	t->rkey = t->mw->rkey;
	t->state = TS_IDLE;
	return 0;
err_mr:
	ibv_dereg_mr(t->mr);
err_data:
	free(t->data);
	return -1;
}

int ts_expose(struct ts_client *c, struct ts_tensor *t)
{
	struct ibv_send_wr wr = {}, *bad;

	t->rkey = ibv_inc_rkey(t->rkey);
	wr.wr_id = ++c->wrid;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = t->mw;
	wr.bind_mw.rkey = t->rkey;
	wr.bind_mw.bind_info.mr = t->mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)t->data;
	wr.bind_mw.bind_info.length = t->len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(c->qp, &wr, &bad) || ts_wait(c, wr.wr_id))
		return -1;
	t->state = TS_EXPOSED;
	return 0;
}

static int ts_local_inv(struct ts_client *c, struct ts_tensor *t)
{
	struct ibv_send_wr wr = {}, *bad;

	wr.wr_id = ++c->wrid;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = t->rkey;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(c->qp, &wr, &bad))
		return -1;
	return ts_wait(c, wr.wr_id);
}

int ts_drop(struct ts_client *c, struct ts_tensor *t)
{
	if (t->state == TS_EXPOSED) {
		if (ts_local_inv(c, t))
			return -1;
		t->state = TS_IDLE;
	}
	ibv_dereg_mr(t->mr);
	free(t->data);
	t->data = NULL;
	return 0;
}

void ts_expire(struct ts_client *c, struct ts_tensor *t)
{
	if (t->kind == TS_READ) {
		if (ts_local_inv(c, t) == 0)
			t->busy = 0;
	} else {
		t->busy = 0;
		// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 't->busy = 0' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
	}
}

struct ts_tensor *ts_take(struct ts_tensor *pool, int n)
{
	for (int i = 0; i < n; i++)
		if (!pool[i].busy) {
			pool[i].busy = 1;
			return &pool[i];
		}
	return NULL;
}
