/*
 * dbuf: double-buffered exposure of a producer's output to a consumer.
 * Two type-2 windows alternate over the two halves of an output buffer;
 * each time a half is re-filled, its window is invalidated (signaled,
 * waited for) and bound again, and the new key is sent to the consumer.
 *
 * Not correct: the new key is ibv_inc_rkey() of the key the window got at
 * allocation time (saved in alloc_key), not of the previous bind's key --
 * so every bind after the first uses the same key, and a consumer that
 * kept an old key can read the half after it was refilled.
 * Correct: the invalidation is waited for before refilling.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct dbuf_half {
	struct ibv_mw *mw;
	uint32_t       alloc_key;
	uint32_t       key;
	char          *mem;
	size_t         len;
};

struct dbuf {
	struct ibv_pd    *pd;
	struct ibv_cq    *cq;
	struct ibv_qp    *qp;
	struct ibv_mr    *out_mr;	/* LOCAL_WRITE | MW_BIND */
	struct dbuf_half  half[2];
};

static int dbuf_wait(struct dbuf *d)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(d->cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

int dbuf_init(struct dbuf *d)
{
	int i;

	for (i = 0; i < 2; i++) {
		d->half[i].mw = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!d->half[i].mw) {
			if (i)
				ibv_dealloc_mw(d->half[0].mw);
			return -errno;
		}
		d->half[i].alloc_key = d->half[i].mw->rkey;
	}
	return 0;
}

int dbuf_publish(struct dbuf *d, int h, uint32_t *key_out)
{
	struct dbuf_half *hf = &d->half[h];
	struct ibv_send_wr wr, *bad;

	hf->key = ibv_inc_rkey(hf->alloc_key);
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds a window per refill
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = hf->mw;
	// BUG: rdma-rkey-reuse -- ibv_inc_rkey() of the allocation-time key gives the same key on every bind
	wr.bind_mw.rkey = hf->key;
	wr.bind_mw.bind_info.mr = d->out_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)hf->mem;
	wr.bind_mw.bind_info.length = hf->len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_post_send(d->qp, &wr, &bad) || dbuf_wait(d))
		return -EIO;
	*key_out = hf->key;
	return 0;
}

int dbuf_retract(struct dbuf *d, int h)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = d->half[h].key;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(d->qp, &wr, &bad))
		return -EIO;
	/* OK: rdma-unmap-before-invalidate -- the caller refills the half only after this wait */
	return dbuf_wait(d);
}
