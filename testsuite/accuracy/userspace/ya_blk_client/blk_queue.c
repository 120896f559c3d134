/*
 * blk_queue.c - queue pair, rings and per-slot state of the block initiator.
 *
 * Right: teardown deregisters the sense buffer before freeing it; the
 * command ring is local-only.  Wrong: the reconnect reset frees each slot's
 * bounce copy while the slot's REMOTE_* registration over it is still live
 * (the target's stale key would work over the new connection: same PD).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blk.h"

int blk_post_rsp_recv(struct blk_queue *q, unsigned idx)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;

	sge.addr   = (uintptr_t)&q->rsps[idx];
	sge.length = sizeof(struct blk_rsp);
	sge.lkey   = q->rsp_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id   = idx;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(q->qp, &wr, &bad);
}

struct blk_queue *blk_queue_create(struct ibv_context *ctx, unsigned depth,
				   struct blk_keyed_sgl *sense_out)
{
	struct ibv_qp_init_attr attr;
	struct blk_queue *q;
	unsigned i;

	if (depth == 0 || depth > BLK_MAX_DEPTH)
		return NULL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->ctx = ctx;
	q->depth = depth;

	q->pd = ibv_alloc_pd(ctx);
	if (!q->pd)
		goto out_free_q;
	q->cq = ibv_create_cq(ctx, 2 * depth + 1, q, NULL, 0);
	if (!q->cq)
		goto out_pd;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = depth + 1;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(q->pd, &attr);
	if (!q->qp)
		goto out_cq;

	q->cmds = calloc(depth, sizeof(*q->cmds));
	q->rsps = calloc(depth, sizeof(*q->rsps));
	if (!q->cmds || !q->rsps)
		goto out_rings;
	q->cmd_mr = ibv_reg_mr(q->pd, q->cmds, depth * sizeof(*q->cmds), 0);
	if (!q->cmd_mr)
		goto out_rings;
	q->rsp_mr = ibv_reg_mr(q->pd, q->rsps, depth * sizeof(*q->rsps),
			       IBV_ACCESS_LOCAL_WRITE);
	if (!q->rsp_mr)
		goto out_cmd_mr;

	if (posix_memalign(&q->sense_buf, 4096, BLK_SENSE_SIZE))
		goto out_rsp_mr;
	q->sense_mr = ibv_reg_mr(q->pd, q->sense_buf, BLK_SENSE_SIZE,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!q->sense_mr)
		goto out_sense;

	for (i = 0; i < depth; i++) {
		if (blk_post_rsp_recv(q, i))
			goto out_sense_mr;
	}

	sense_out->addr = (uintptr_t)q->sense_buf;
	sense_out->len  = BLK_SENSE_SIZE;
	sense_out->key  = q->sense_mr->rkey;
	return q;

out_sense_mr:
	ibv_dereg_mr(q->sense_mr);
out_sense:
	free(q->sense_buf); // OK: rdma-invalidation-leak -- only reached after the sense MR is gone (or was never registered)
out_rsp_mr:
	ibv_dereg_mr(q->rsp_mr);
out_cmd_mr:
	ibv_dereg_mr(q->cmd_mr);
out_rings:
	free(q->rsps);
	free(q->cmds);
	ibv_destroy_qp(q->qp);
out_cq:
	ibv_destroy_cq(q->cq);
out_pd:
	ibv_dealloc_pd(q->pd);
out_free_q:
	free(q);
	return NULL;
}

/*
 * Connection lost: fail everything in flight before the queue pair is
 * re-created in the same protection domain.
 */
void blk_queue_reset(struct blk_queue *q)
{
	struct blk_io *io;
	unsigned tag;

	for (tag = 0; tag < q->depth; tag++) {
		if (!q->slot_busy[tag])
			continue;

		free(q->bounce[tag]); // BUG: rdma-invalidation-leak -- data_mr[tag] still grants the target REMOTE access to this bounce copy
		q->bounce[tag] = NULL;
		if (q->data_mr[tag]) {
			ibv_dereg_mr(q->data_mr[tag]);
			q->data_mr[tag] = NULL;
		}

		io = q->io[tag];
		blk_free_tag(q, tag); // OK: rdma-invalidation-leak -- the slot's registration was dropped just above
		if (io)
			io->done(io, -ECONNRESET);
	}
}

void blk_queue_destroy(struct blk_queue *q)
{
	blk_queue_reset(q);

	ibv_destroy_qp(q->qp);
	free(q->cmds); // OK: rdma-invalidation-leak -- the command ring is registered without remote rights
	ibv_dereg_mr(q->cmd_mr);
	ibv_dereg_mr(q->sense_mr);
	free(q->sense_buf); // OK: rdma-invalidation-leak -- deregistered on the line above
	ibv_dereg_mr(q->rsp_mr);
	free(q->rsps);
	ibv_destroy_cq(q->cq);
	ibv_dealloc_pd(q->pd);
	free(q);
}
