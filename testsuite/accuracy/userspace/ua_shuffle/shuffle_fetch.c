/*
 * shuffle_fetch.c - reducer side.  Each FETCH reply is pulled into a pool
 * chunk registered at start-up with one chain of RDMA READs (only the last
 * signaled), then the blocks are released.  Push mode exposes a merge buffer
 * that servers write into.  Correct: READ sinks without REMOTE_WRITE on this
 * IB-only service, pool unwinding.  Bug: the push buffer asks for
 * REMOTE_WRITE without LOCAL_WRITE (push mode silently never comes up).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include "shuffle.h"

#define FETCH_CHUNK	(SHUF_MAX_BLOCKS * (256UL << 10))
#define PUSH_SIZE	(64UL << 20)

struct fetch_req {
	int			used;
	uint32_t		fetch_id;
	struct ibv_send_wr	wr[SHUF_MAX_BLOCKS];
	struct ibv_sge		sge[SHUF_MAX_BLOCKS];
};

struct reducer {
	char			*pool[SHUF_MAX_INFLIGHT];
	struct ibv_mr		*pool_mr[SHUF_MAX_INFLIGHT];
	struct fetch_req	reqs[SHUF_MAX_INFLIGHT];
	char			*push;
	struct ibv_mr		*push_mr;
};

int fetch_init(struct shuf_conn *conn, int push_mode)
{
	struct shuf_msg msg = { .type = SHUF_PUSH_READY, .nblocks = 1 };
	struct reducer *r = calloc(1, sizeof(*r));
	int i;

	if (!r)
		return -ENOMEM;
	for (i = 0; i < SHUF_MAX_INFLIGHT; i++) {
		r->pool[i] = aligned_alloc(4096, FETCH_CHUNK);
		r->pool_mr[i] = r->pool[i] ? ibv_reg_mr(conn->dev->pd, r->pool[i], FETCH_CHUNK, IBV_ACCESS_LOCAL_WRITE) : NULL; /* BUG: rdma-local-mr-management -- pool chunks are the local side of the reducer's RDMA READs */
		if (!r->pool_mr[i])
			goto unwind;
	}
	conn->priv = r;
	if (!push_mode)
		return 0;
	r->push = aligned_alloc(4096, PUSH_SIZE);
	r->push_mr = ibv_reg_mr(conn->dev->pd, r->push, PUSH_SIZE, IBV_ACCESS_REMOTE_WRITE); /* BUG: rdma-access-flags-invalid, rdma-local-mr-management -- REMOTE_WRITE without LOCAL_WRITE fails with EINVAL; the buffer's rkey is sent to the servers */
	if (!r->push_mr) {
		fprintf(stderr, "shuffle: push mode unavailable, fetching only\n");
		free(r->push);
		r->push = NULL;
		return 0;
	}
	msg.blocks[0] = (struct shuf_block_desc){ 0, (uintptr_t)r->push, PUSH_SIZE, r->push_mr->rkey };
	return shuf_send(conn, &msg, 1);

unwind:
	free(r->pool[i]);
	while (i--) {
		ibv_dereg_mr(r->pool_mr[i]); /* OK: rdma-mr-leak -- every chunk registered before the failure is released */
		free(r->pool[i]);
	}
	free(r);
	return -ENOMEM;
}

int fetch_issue(struct shuf_conn *conn, const struct shuf_msg *reply)
{
	struct reducer *r = conn->priv;
	struct fetch_req *q = NULL;
	struct ibv_send_wr *bad;
	uint64_t off = 0;
	unsigned i, k;

	for (k = 0; k < SHUF_MAX_INFLIGHT && !q; k++)
		if (!r->reqs[k].used)
			q = &r->reqs[k];
	if (!q || !reply->nblocks || reply->nblocks > SHUF_MAX_BLOCKS)
		return -EAGAIN;
	k = q - r->reqs;
	q->used = 1;
	q->fetch_id = reply->fetch_id;
	for (i = 0; i < reply->nblocks; i++) {
		if (off + reply->blocks[i].len > FETCH_CHUNK)
			break;
		q->sge[i] = (struct ibv_sge){ (uintptr_t)r->pool[k] + off, reply->blocks[i].len, r->pool_mr[k]->lkey };
		memset(&q->wr[i], 0, sizeof(q->wr[i]));
		q->wr[i].wr_id = (uintptr_t)q;
		q->wr[i].opcode = IBV_WR_RDMA_READ;
		q->wr[i].sg_list = &q->sge[i];
		q->wr[i].num_sge = 1;
		q->wr[i].wr.rdma.remote_addr = reply->blocks[i].addr;
		q->wr[i].wr.rdma.rkey = reply->blocks[i].rkey;
		q->wr[i].next = &q->wr[i + 1];
		off += reply->blocks[i].len;
	}
	q->wr[i - 1].next = NULL;
	q->wr[i - 1].send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(conn->qp, q->wr, &bad); /* OK: rdma-access-flags-transport -- pool chunks need no REMOTE_WRITE: shuf_dev_open() only opens InfiniBand/RoCE devices */
}

void fetch_complete(struct shuf_conn *conn, struct ibv_wc *wc)
{
	struct fetch_req *q = (struct fetch_req *)(uintptr_t)wc->wr_id;
	struct shuf_msg msg = { .type = SHUF_RELEASE, .fetch_id = q->fetch_id };

	if (wc->status != IBV_WC_SUCCESS)
		fprintf(stderr, "shuffle: fetch %u failed: %s\n", q->fetch_id, ibv_wc_status_str(wc->status));
	shuf_send(conn, &msg, 0);
	q->used = 0;
}
