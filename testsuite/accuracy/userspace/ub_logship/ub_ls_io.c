/*
 * ub_ls_io.c - data path of the log shipper.
 *
 * Primary: ls_ship() copies a batch into its staging slice (registered on
 * first use) and posts RDMA WRITE into the replica ring chained with the
 * COMMIT SEND; one COMMIT in LS_SIG_EVERY is signaled.  A single record
 * larger than a slice is written straight from the caller's memory.
 * Replica: applies committed batches, returns credits with ACKs and, on a
 * gap, pulls the primary's manifest and the missing range with RDMA READ.
 *
 * Not right: oversized records are registered per batch and deregistered
 * in the completion handler, and leak when the post fails; the manifest is
 * read into memory without remote write; the ACK signaling counter never
 * moves.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "ub_logship.h"

#define LS_SLICE	(LS_STAGE_SIZE / LS_CREDITS)
#define LS_WRID_READ_MANIFEST	0xfffffff0u
#define LS_WRID_READ_RANGE	0xfffffff1u

int ls_post_recv(struct ls_conn *c, int i)
{
	return rdma_post_recv(c->id, (void *)(uintptr_t)i, &c->recv_msgs[i],
			      sizeof(c->recv_msgs[i]), c->recv_mr);
}

/* the batch's slice of the staging area, registered on first use */
static uint8_t *ls_stage_slice(struct ls_conn *c, int slot)
{
	if (!c->stage_mr) {
		c->stage = aligned_alloc(4096, LS_STAGE_SIZE);
		if (!c->stage)
			return NULL;
		/* OK: rdma-registration-in-datapath -- the staging area is registered on first use and kept */
		c->stage_mr = rdma_reg_msgs(c->id, c->stage, LS_STAGE_SIZE); // BUG: rdma-local-mr-management -- the staging area is the local side of the primary's RDMA WRITE
		if (!c->stage_mr) {
			free(c->stage);
			c->stage = NULL;
			return NULL;
		}
	}
	return (uint8_t *)c->stage + (size_t)slot * LS_SLICE;
}

int ls_ship(struct ls_conn *c, const struct ls_record *recs, int n)
{
	struct ibv_send_wr *bad;
	struct ibv_mr *mr = NULL;
	struct ls_batch *b;
	struct ls_msg *m;
	size_t len = 0, off;
	uint8_t *slice;
	int i, slot;

	if (!c->credits)
		return -EAGAIN;
	for (slot = 0; slot < LS_CREDITS && c->batches[slot].busy; slot++)
		;
	if (slot == LS_CREDITS)
		return -EAGAIN;
	for (i = 0; i < n; i++)
		len += recs[i].len;
	b = &c->batches[slot];
	off = c->ring_tail % c->remote_size;

	if (len > LS_SLICE) {
		if (n != 1)
			return -E2BIG;
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- an oversized record is registered for this one batch */
		mr = rdma_reg_msgs(c->id, (void *)recs[0].data, len);
		if (!mr)
			return -errno;
		b->write_sge.addr = (uintptr_t)recs[0].data;
		b->write_sge.lkey = mr->lkey;
	} else {
		slice = ls_stage_slice(c, slot);
		if (!slice)
			return -ENOMEM;
		for (i = 0, len = 0; i < n; len += recs[i].len, i++)
			memcpy(slice + len, recs[i].data, recs[i].len);
		b->write_sge.addr = (uintptr_t)slice;
		b->write_sge.lkey = c->stage_mr->lkey;
	}
	b->write_sge.length = (uint32_t)len;

	m = &c->send_msgs[slot];
	m->type = LS_COMMIT;
	m->len = (uint32_t)len;
	m->lsn = recs[0].lsn;
	m->ring_off = off;
	m->credits = 0;
	b->commit_sge = (struct ibv_sge){ (uintptr_t)m, sizeof(*m), c->send_mr->lkey };

	b->write_wr = (struct ibv_send_wr){
		.wr_id = slot, .next = &b->commit_wr,
		.sg_list = &b->write_sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, /* OK: rdma-access-flags-transport -- the staging area is a WRITE source, local access is enough on iWARP too */
		.wr.rdma = { .remote_addr = c->remote_addr + off, .rkey = c->remote_rkey },
	};
	b->commit_wr = (struct ibv_send_wr){
		.wr_id = slot, .sg_list = &b->commit_sge, .num_sge = 1,
		.opcode = IBV_WR_SEND,
	};
	if (sizeof(*m) <= c->max_inline)
		b->commit_wr.send_flags = IBV_SEND_INLINE;
	/* OK: rdma-unsignaled-send-starvation -- the COMMIT counter advances with every batch */
	if (++c->unsig >= LS_SIG_EVERY || mr) {
		b->commit_wr.send_flags |= IBV_SEND_SIGNALED;
		c->unsig = 0;
	}

	if (ibv_post_send(c->qp, &b->write_wr, &bad))
		return -EIO; // BUG: rdma-mr-leak -- the per-record MR is lost when the post fails
	b->big_mr = mr;
	b->busy = 1;
	c->credits--;
	c->ring_tail += len;
	return 0;
}

static int ls_send_ack(struct ls_conn *c, uint32_t credits)
{
	struct ls_msg *ack = &c->send_msgs[0];	/* inline: reusable at once */
	int flags = IBV_SEND_INLINE;

	ack->type = LS_ACK;
	ack->credits = credits;
	if (c->acks_unsig >= LS_SIG_EVERY) { // BUG(program): rdma-unsignaled-send-starvation -- acks_unsig is reset here and zeroed at setup but never incremented, so ACKs are never signaled
		flags |= IBV_SEND_SIGNALED;
		c->acks_unsig = 0;
	}
	return rdma_post_send(c->id, NULL, ack, sizeof(*ack), c->send_mr, flags);
}

/* replica: we missed batches, fetch the primary's manifest first */
static int ls_pull_manifest(struct ls_conn *c)
{
	return rdma_post_read(c->id, (void *)(uintptr_t)LS_WRID_READ_MANIFEST, c->manifest,
			      sizeof(*c->manifest), c->manifest_mr, IBV_SEND_SIGNALED,
			      c->remote_addr, c->remote_rkey); // BUG: rdma-access-flags-transport -- the manifest MR is rdma_reg_msgs() (local write only); the READ fails on iWARP
}

static int ls_pull_range(struct ls_conn *c, uint64_t src_off, size_t len)
{
	uint64_t dst = c->ring_tail % c->ring->size;

	if (dst + len > c->ring->size)
		return -ENOSPC;
	return rdma_post_read(c->id, (void *)(uintptr_t)LS_WRID_READ_RANGE,
			      (uint8_t *)c->ring->base + dst, len, c->ring->mr, IBV_SEND_SIGNALED,
			      c->remote_addr + src_off, c->remote_rkey); /* OK: rdma-access-flags-transport -- the ring is registered with rdma_reg_write, the READ sink has remote write */
}

static void ls_on_recv(struct ls_conn *c, struct ibv_wc *wc)
{
	struct ls_msg *m = &c->recv_msgs[wc->wr_id];
	struct ls_batch *b;
	int i;

	if (m->type == LS_COMMIT) {
		if (m->lsn != c->next_lsn && c->next_lsn) {
			ls_pull_manifest(c);
		} else {
			c->apply((uint8_t *)c->ring->base + m->ring_off, m->len);
			c->next_lsn = m->lsn + 1;
			c->ring_tail = m->ring_off + m->len;
			ls_send_ack(c, 1);
		}
	} else if (m->type == LS_ACK) {
		c->credits += m->credits;
		/* the oldest un-acked batch is done, unless its send completion still owns an MR */
		for (i = 0; i < LS_CREDITS; i++) {
			b = &c->batches[i];
			if (b->busy && !b->big_mr) {
				b->busy = 0;
				break;
			}
		}
	}
	ls_post_recv(c, (int)wc->wr_id);
}

static void ls_on_send_comp(struct ls_conn *c, struct ibv_wc *wc)
{
	struct ls_batch *b;
	uint64_t first, last;

	if (wc->wr_id == LS_WRID_READ_MANIFEST) {
		first = c->next_lsn - c->manifest->first_lsn;
		last = c->manifest->last_lsn - c->manifest->first_lsn;
		if (first < LS_MANIFEST_MAX && last < LS_MANIFEST_MAX && last > first)
			ls_pull_range(c, c->manifest->seg_off[first],
				      c->manifest->seg_off[last] - c->manifest->seg_off[first]);
		return;
	}
	if (wc->wr_id == LS_WRID_READ_RANGE || wc->wr_id >= LS_CREDITS)
		return;
	b = &c->batches[wc->wr_id];
	if (b->big_mr) {
		rdma_dereg_mr(b->big_mr); // BUG: rdma-registration-in-datapath -- the per-record registration is undone in the completion handler, once per batch
		b->big_mr = NULL;
		b->busy = 0;
	}
}

int ls_process_cq(struct ls_conn *c)
{
	struct ibv_wc wc[16];
	int n, i, total = 0;

	n = ibv_poll_cq(c->id->recv_cq, 16, wc);
	for (i = 0; i < n; i++)
		if (wc[i].status == IBV_WC_SUCCESS)
			ls_on_recv(c, &wc[i]);
	total += n > 0 ? n : 0;
	n = ibv_poll_cq(c->id->send_cq, 16, wc);
	for (i = 0; i < n; i++)
		if (wc[i].status == IBV_WC_SUCCESS)
			ls_on_send_comp(c, &wc[i]);
	return total + (n > 0 ? n : 0);
}
