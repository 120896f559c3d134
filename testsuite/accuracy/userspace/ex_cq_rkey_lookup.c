/*
 * objsrv-client: client of an object server that answers every request
 * with SEND_WITH_INV on the key of the buffer it wrote into.  Two
 * completion paths exist:
 *  - the request/response path looks the request up by the invalidated
 *    key itself (a hash of live keys), so a completion can only retire the
 *    request whose key was really invalidated;
 *  - the notification path (server-pushed updates into a pre-bound
 *    notification window) only checks that *some* key was invalidated
 *    (invalidated_rkey != 0) before re-arming the window, which is not a
 *    comparison with the notification window's key.
 * Completions are read from an extended CQ.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OC_HASH	256

struct oc_req {
	struct oc_req *hnext;
	uint32_t       key;
	struct ibv_mw *mw;
	void         (*cb)(struct oc_req *, int);
};

struct oc_notify {
	struct ibv_mw *mw;
	uint32_t       key;
	int            armed;
};

struct oc_client {
	struct ibv_cq_ex *cq;
	struct ibv_qp    *qp;
	struct oc_req    *live[OC_HASH];
	struct oc_notify  notify;
};

static struct oc_req *oc_take_by_key(struct oc_client *c, uint32_t key)
{
	struct oc_req **pp = &c->live[key % OC_HASH];

	for (; *pp; pp = &(*pp)->hnext)
		if ((*pp)->key == key) {
			struct oc_req *r = *pp;

			*pp = r->hnext;
			return r;
		}
	return NULL;
}

void oc_rearm_notify(struct oc_client *c);

static void oc_handle_recv(struct oc_client *c, uint64_t wr_id)
{
	unsigned int flags = ibv_wc_read_wc_flags(c->cq);
	struct oc_req *r;

	if (wr_id == 0) {	/* notification */
		// BUG: rdma-remote-invalidate-unchecked -- invalidated_rkey is only tested for non-zero, never compared with notify.key
		if ((flags & IBV_WC_WITH_INV) && ibv_wc_read_invalidated_rkey(c->cq) != 0) {
			c->notify.armed = 0;
			oc_rearm_notify(c);
		}
		return;
	}
	if (!(flags & IBV_WC_WITH_INV))
		return;		/* old server: the request times out and is invalidated locally */
	/* OK: rdma-remote-invalidate-unchecked -- the request is found by the invalidated key itself */
	r = oc_take_by_key(c, ibv_wc_read_invalidated_rkey(c->cq));
	if (r)
		r->cb(r, 0);
}

void oc_poll(struct oc_client *c)
{
	struct ibv_poll_cq_attr attr = { 0 };

	if (ibv_start_poll(c->cq, &attr))
		return;
	do {
		if (c->cq->status == IBV_WC_SUCCESS &&
		    ibv_wc_read_opcode(c->cq) == IBV_WC_RECV)
			oc_handle_recv(c, c->cq->wr_id);
	} while (ibv_next_poll(c->cq) == 0);
	ibv_end_poll(c->cq);
}
