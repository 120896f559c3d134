/*
 * gstage: host staging for a GPU inference server.  Each inference request
 * gets a staging slot that the remote feature store RDMA-WRITEs the input
 * tensor into; the slot is exposed through a type-2 window bound with a
 * BIND_MW work request built from a designated initializer.  The feature
 * store answers with SEND_WITH_INV.
 *
 * Not correct:
 *  - the bind work request takes .rkey = slot->mw->rkey, the window's
 *    current key, on every request;
 *  - the completion code keeps "was it remotely invalidated" in a local
 *    bool and retires the slot on it, never comparing the invalidated key.
 * Correct: the staging MR carries LOCAL_WRITE and MW_BIND for the
 * remote-write window; the slot is not reused until the key is dead
 * (modulo the unchecked comparison above).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GS_SLOTS	32
#define GS_SLOT_SIZE	(8u << 20)

struct gs_slot {
	struct ibv_mw *mw;
	char          *buf;
	bool           live;
};

struct gstage {
	struct ibv_pd  *pd;
	struct ibv_qp  *qp;
	char           *staging;
	struct ibv_mr  *staging_mr;
	struct gs_slot  slot[GS_SLOTS];
};

int gstage_init(struct gstage *g)
{
	int i;

	g->staging = aligned_alloc(1 << 21, (size_t)GS_SLOTS * GS_SLOT_SIZE);
	if (!g->staging)
		return -ENOMEM;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE and MW_BIND for remote-write windows */
	/* OK: rdma-local-mr-management -- the MR under the windows; the window sites are the ones reported */
	g->staging_mr = ibv_reg_mr(g->pd, g->staging, (size_t)GS_SLOTS * GS_SLOT_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!g->staging_mr)
		goto err;
	for (i = 0; i < GS_SLOTS; i++) {
		g->slot[i].buf = g->staging + (size_t)i * GS_SLOT_SIZE;
		g->slot[i].mw = ibv_alloc_mw(g->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!g->slot[i].mw)
			goto err_mw;
	}
	return 0;
err_mw:
	/* OK: rdma-mr-leak -- windows and the staging MR are released */
	while (i--)
		ibv_dealloc_mw(g->slot[i].mw);
	ibv_dereg_mr(g->staging_mr);
err:
	free(g->staging);
	return -ENOMEM;
}

int gstage_expose(struct gstage *g, int i, uint32_t len, uint32_t *key)
{
	struct gs_slot *s = &g->slot[i];
	struct ibv_send_wr wr = {
		.wr_id = (uintptr_t)s,
		.opcode = IBV_WR_BIND_MW, // BUG: rdma-local-mr-management -- per-request window bind done by the ULP
		.send_flags = IBV_SEND_SIGNALED,
		.bind_mw = {
			.mw = s->mw,
			.rkey = s->mw->rkey, // BUG: rdma-rkey-reuse -- the current key again, not ibv_inc_rkey()
			.bind_info = {
				.mr = g->staging_mr,
				.addr = (uintptr_t)s->buf,
				.length = len,
				.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
			},
		},
	}, *bad;

	if (len > GS_SLOT_SIZE)
		return -EINVAL;
	if (ibv_post_send(g->qp, &wr, &bad))
		return -EIO;
	s->live = true;
	*key = s->mw->rkey;
	return 0;
}

void gstage_post_inv(struct gstage *g, struct gs_slot *s);

void gstage_input_ready(struct gstage *g, int i, const struct ibv_wc *wc)
{
	struct gs_slot *s = &g->slot[i];
	bool invalidated = wc->wc_flags & IBV_WC_WITH_INV;

	// BUG: rdma-remote-invalidate-unchecked -- 'invalidated' says some key died; wc->invalidated_rkey is never compared with the slot's
	if (invalidated) {
		s->live = false;
		return;
	}
	gstage_post_inv(g, s);
}
