/*
 * ra_tlm_double_buffer.c -- streaming telemetry exporter, double buffered.
 *
 * Samples are appended to the back slot's frame while the collector reads
 * the front slot's frame with RDMA READ.  At every epoch boundary the
 * exporter flips: it binds the back slot's type-2 window over the frame
 * (REMOTE_READ), sends the collector a note {epoch, addr, len, rkey} in the
 * same post, and retires the old front with a signaled LOCAL_INV; the
 * retired frame goes back to the frame pool from that completion.  Frames
 * come from one arena registered with LOCAL_WRITE | MW_BIND.
 *
 * Right: normal publish (fresh key per epoch), normal retire, failure paths
 * of the posts, exporter shutdown (windows deallocated before the arena).
 * Wrong: pinned-key publishing for legacy collectors binds every epoch of a
 * slot under one key; lossy retiring recycles the frame as soon as its
 * LOCAL_INV is posted; a collector heartbeat timeout recycles published
 * frames without invalidating them; exporter setup leaks the arena MR when
 * the note ring cannot be registered.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-local-mr-management,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked
 *   -- not reviewed in this file
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define TLM_FRAME_SIZE		(256 * 1024)
#define TLM_NFRAMES		8
#define TLM_HEARTBEAT_SECS	10

#define TLM_WR_NOTE		1u
#define TLM_WR_INV		2u
#define TLM_WR_BIND		3u
#define TLM_WRID(s, t)		((uint64_t)(uintptr_t)(s) | (t))

enum tlm_slot_state { SLOT_FILLING, SLOT_PUBLISHED, SLOT_RETIRING };

struct tlm_note {
	uint64_t epoch;
	uint64_t addr;
	uint32_t len;
	uint32_t rkey;
};

struct tlm_slot {
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key of the current binding */
	enum tlm_slot_state	state;
	void			*frame;
	size_t			used;
	void			*retiring;	/* frame whose LOCAL_INV is in flight */
	struct tlm_note		*note;
	struct ibv_sge		note_sge;
	struct ibv_send_wr	bind_wr, note_wr, inv_wr;
};

struct tlm_exporter {
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	uint8_t			*arena;
	struct ibv_mr		*arena_mr;
	struct tlm_note		*notes;
	struct ibv_mr		*note_mr;
	void			*free_frames[TLM_NFRAMES];
	int			nfree;
	struct tlm_slot		slot[2];
	int			back;
	uint64_t		epoch;
	time_t			last_heartbeat;
	bool			lossy;
	bool			pinned_keys;	/* legacy collectors cache one key per slot */
};

static void *tlm_frame_get(struct tlm_exporter *exp)
{
	return exp->nfree ? exp->free_frames[--exp->nfree] : NULL;
}

static void tlm_frame_put(struct tlm_exporter *exp, void *frame)
{
	exp->free_frames[exp->nfree++] = frame;
}

static inline uint32_t tlm_next_key(const struct tlm_slot *s)
{
	return ibv_inc_rkey(s->rkey);
}

/* bind + note, chained through the slot's own work requests */
static int tlm_post_publish(struct tlm_exporter *exp, struct tlm_slot *s, uint32_t key)
{
	struct ibv_send_wr *bad;

	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	s->bind_wr.wr_id = TLM_WRID(s, TLM_WR_BIND);
	s->bind_wr.opcode = IBV_WR_BIND_MW;
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = key;
	s->bind_wr.bind_mw.bind_info.mr = exp->arena_mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)s->frame;
	s->bind_wr.bind_mw.bind_info.length = s->used;
	s->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	s->bind_wr.next = &s->note_wr;

	s->note->epoch = exp->epoch;
	s->note->addr = (uintptr_t)s->frame;
	s->note->len = (uint32_t)s->used;
	s->note->rkey = key;
	s->note_sge.addr = (uintptr_t)s->note;
	s->note_sge.length = sizeof(*s->note);
	s->note_sge.lkey = exp->note_mr->lkey;
	memset(&s->note_wr, 0, sizeof(s->note_wr));
	s->note_wr.wr_id = TLM_WRID(s, TLM_WR_NOTE);
	s->note_wr.opcode = IBV_WR_SEND;
	s->note_wr.sg_list = &s->note_sge;
	s->note_wr.num_sge = 1;
	s->note_wr.send_flags = IBV_SEND_SIGNALED;

	if (ibv_post_send(exp->qp, &s->bind_wr, &bad))
		return -1;
	s->rkey = key;
	s->state = SLOT_PUBLISHED;
	return 0;
}

static int tlm_publish(struct tlm_exporter *exp, struct tlm_slot *s)
{
	return tlm_post_publish(exp, s, tlm_next_key(s));	// OK: rdma-rkey-reuse -- every epoch gets a rotated key
}

static int tlm_publish_pinned(struct tlm_exporter *exp, struct tlm_slot *s)
{
	/* the collector reads the slot with the key it cached at attach time */
	return tlm_post_publish(exp, s, s->rkey);	// BUG: rdma-rkey-reuse -- every epoch of the slot is bound under the same key
}

static int tlm_retire(struct tlm_exporter *exp, struct tlm_slot *s)
{
	struct ibv_send_wr *bad;

	memset(&s->inv_wr, 0, sizeof(s->inv_wr));
	s->inv_wr.wr_id = TLM_WRID(s, TLM_WR_INV);
	s->inv_wr.opcode = IBV_WR_LOCAL_INV;
	s->inv_wr.invalidate_rkey = s->rkey;
	s->inv_wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(exp->qp, &s->inv_wr, &bad))
		return -1;
	s->retiring = s->frame;
	s->frame = NULL;
	s->state = SLOT_RETIRING;
	return 0;
}

/* Lossy collectors tolerate torn epochs: do not wait for the invalidation. */
static int tlm_retire_lossy(struct tlm_exporter *exp, struct tlm_slot *s)
{
	struct ibv_send_wr *bad;

	memset(&s->inv_wr, 0, sizeof(s->inv_wr));
	s->inv_wr.wr_id = TLM_WRID(s, TLM_WR_INV);
	s->inv_wr.opcode = IBV_WR_LOCAL_INV;
	s->inv_wr.invalidate_rkey = s->rkey;
	if (ibv_post_send(exp->qp, &s->inv_wr, &bad))
		return -1;
	/* OK: rdma-invalidation-leak -- the window's LOCAL_INV was posted */
	tlm_frame_put(exp, s->frame);	// BUG: rdma-unmap-before-invalidate -- the frame is back in the pool before the unsignaled LOCAL_INV executed; the collector can read the next owner's samples
	s->frame = NULL;
	s->state = SLOT_FILLING;
	return 0;
}

int tlm_progress(struct tlm_exporter *exp)
{
	struct ibv_wc wc[8];
	int i, n = ibv_poll_cq(exp->cq, 8, wc);

	for (i = 0; i < n; i++) {
		struct tlm_slot *s = (void *)(uintptr_t)(wc[i].wr_id & ~3ULL);

		if ((wc[i].wr_id & 3) != TLM_WR_INV)
			continue;
		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "tlm: LOCAL_INV failed (%s), frame quarantined\n",
				ibv_wc_status_str(wc[i].status));
			s->retiring = NULL;
			continue;
		}
		tlm_frame_put(exp, s->retiring);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- recycled from the successful completion of its LOCAL_INV
		s->retiring = NULL;
		s->state = SLOT_FILLING;
	}
	return n;
}

int tlm_flip(struct tlm_exporter *exp)
{
	struct tlm_slot *back = &exp->slot[exp->back], *front = &exp->slot[!exp->back];
	int ret;

	exp->epoch++;
	ret = exp->pinned_keys ? tlm_publish_pinned(exp, back) : tlm_publish(exp, back);
	if (ret)
		return ret;
	if (front->state == SLOT_PUBLISHED) {
		ret = exp->lossy ? tlm_retire_lossy(exp, front) : tlm_retire(exp, front);
		if (ret)
			return ret;
	}
	while (front->state == SLOT_RETIRING)
		tlm_progress(exp);
	front->frame = tlm_frame_get(exp);
	front->used = 0;
	exp->back = !exp->back;
	return front->frame ? 0 : -1;
}

/* Collector missed its heartbeats: stop exporting until it reattaches. */
void tlm_detach(struct tlm_exporter *exp)
{
	int i;

	if (time(NULL) - exp->last_heartbeat < TLM_HEARTBEAT_SECS)
		return;
	for (i = 0; i < 2; i++) {
		struct tlm_slot *s = &exp->slot[i];

		if (s->state != SLOT_PUBLISHED)
			continue;
		tlm_frame_put(exp, s->frame);	// BUG: rdma-invalidation-leak -- the published window is still bound over the frame and the collector has its key
		s->frame = NULL;
		s->state = SLOT_FILLING;
	}
}

struct tlm_exporter *tlm_exporter_create(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_qp *qp)
{
	struct tlm_exporter *exp = calloc(1, sizeof(*exp));
	int i;

	if (!exp)
		return NULL;
	exp->pd = pd;
	exp->cq = cq;
	exp->qp = qp;
	exp->arena = aligned_alloc(4096, (size_t)TLM_NFRAMES * TLM_FRAME_SIZE);
	exp->notes = calloc(2, sizeof(*exp->notes));
	if (!exp->arena || !exp->notes)
		goto err_mem;
	exp->arena_mr = ibv_reg_mr(pd, exp->arena, (size_t)TLM_NFRAMES * TLM_FRAME_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!exp->arena_mr)
		goto err_mem;
	exp->note_mr = ibv_reg_mr(pd, exp->notes, 2 * sizeof(*exp->notes), IBV_ACCESS_LOCAL_WRITE);
	if (!exp->note_mr)
		goto err_mem;	// BUG: rdma-mr-leak -- err_mem does not deregister the arena MR
	for (i = 0; i < 2; i++) {
		exp->slot[i].mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (!exp->slot[i].mw)
			goto err_mw;
		exp->slot[i].rkey = exp->slot[i].mw->rkey;
		exp->slot[i].note = &exp->notes[i];
	}
	for (i = 0; i < TLM_NFRAMES; i++)
		tlm_frame_put(exp, exp->arena + (size_t)i * TLM_FRAME_SIZE);
	exp->slot[0].frame = tlm_frame_get(exp);
	exp->last_heartbeat = time(NULL);
	return exp;

err_mw:
	while (i-- > 0)		// OK: rdma-mr-leak -- slot i has no window; the earlier ones are deallocated
		ibv_dealloc_mw(exp->slot[i].mw);
	ibv_dereg_mr(exp->note_mr);
	ibv_dereg_mr(exp->arena_mr);
err_mem:
	free(exp->notes);
	free(exp->arena);	// OK: rdma-invalidation-leak -- the arena MR grants no remote access and no window was bound yet
	free(exp);
	return NULL;
}

void tlm_exporter_destroy(struct tlm_exporter *exp)
{
	int i;

	for (i = 0; i < 2; i++)
		ibv_dealloc_mw(exp->slot[i].mw);	// OK: rdma-invalidation-leak -- deallocation kills a published window's key
	ibv_dereg_mr(exp->note_mr);
	ibv_dereg_mr(exp->arena_mr);
	free(exp->notes);
	free(exp->arena);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- windows deallocated and arena deregistered first
	free(exp);
}
