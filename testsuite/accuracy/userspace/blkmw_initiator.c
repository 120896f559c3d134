/*
 * blkmw: a tiny block initiator over an RC QP that exposes each I/O buffer
 * to the target through a type-2 memory window.
 *
 * One data MR covers the whole buffer arena (LOCAL_WRITE | MW_BIND, no
 * remote rights of its own).  Every command binds its request's window over
 * the request's slice (BIND_MW chained in front of the command SEND); the
 * target RDMA-READs or -WRITEs through the window's rkey and answers with
 * SEND_WITH_INV naming that rkey.  When the reply carries no invalidation
 * (older targets) the initiator posts a signaled LOCAL_INV and completes the
 * request from that completion.
 *
 * Correct: window access vs. the MR's rights, key rotation with
 * ibv_inc_rkey() per bind, the remote invalidation is compared with the
 * request's key, the MWs are unwound on a setup failure, and the send queue
 * holds BIND + SEND + LOCAL_INV per request.
 * Not correct: the timeout path hands the request (and its slice) back while
 * the window is still bound, and the queue is sized by a hand-made factor
 * (migration note).
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLKMW_DEPTH       32
#define BLKMW_IO_MAX      (128u * 1024u)
#define BLKMW_WRS_PER_IO  3	/* BIND_MW, SEND, LOCAL_INV */
#define BLKMW_INV_TAG     (1ull << 63)

enum { BLKMW_OP_READ = 1, BLKMW_OP_WRITE = 2 };

struct blkmw_cmd {
	uint8_t  opcode;
	uint8_t  rsvd[3];
	uint32_t tag;
	uint64_t lba;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct blkmw_rsp {
	uint32_t tag;
	int32_t  status;
};

struct blkmw_queue;

struct blkmw_req {
	struct blkmw_req   *next_free;
	struct blkmw_queue *q;
	uint32_t            tag;
	int                 busy;
	struct ibv_mw      *mw;
	uint32_t            rkey;
	char               *data;
	struct ibv_sge      cmd_sge;
	struct ibv_send_wr  bind_wr;
	struct ibv_send_wr  send_wr;
	struct ibv_send_wr  inv_wr;
	time_t              deadline;
	int                 status;
	void              (*done)(struct blkmw_req *, int);
};

struct blkmw_queue {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *data_mr;
	struct ibv_mr      *msg_mr;
	char               *arena;
	struct blkmw_cmd   *cmds;
	struct blkmw_rsp   *rsps;
	unsigned int        depth;
	struct blkmw_req    reqs[BLKMW_DEPTH];
	struct blkmw_req   *free_list;
};

static struct blkmw_req *blkmw_get_req(struct blkmw_queue *q)
{
	struct blkmw_req *r = q->free_list;

	if (r) {
		q->free_list = r->next_free;
		r->busy = 1;
	}
	return r;
}

static void blkmw_put_req(struct blkmw_queue *q, struct blkmw_req *r)
{
	r->busy = 0;
	r->next_free = q->free_list;
	q->free_list = r;
}

static int blkmw_post_recv(struct blkmw_queue *q, unsigned int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&q->rsps[slot],
		.length = sizeof(struct blkmw_rsp),
		.lkey = q->msg_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(q->qp, &wr, &bad);
}

int blkmw_queue_init(struct blkmw_queue *q, struct ibv_context *ctx)
{
	struct ibv_device_attr attr;
	struct ibv_qp_init_attr qpa;
	size_t msg_len;
	unsigned int i;

	memset(q, 0, sizeof(*q));
	q->ctx = ctx;
	if (ibv_query_device(ctx, &attr))
		return -errno;
	q->depth = BLKMW_DEPTH;
	if ((unsigned int)attr.max_qp_wr < BLKMW_WRS_PER_IO * q->depth + 1)
		q->depth = (attr.max_qp_wr - 1) / BLKMW_WRS_PER_IO;

	q->pd = ibv_alloc_pd(ctx);
	if (!q->pd)
		return -errno;
	q->cq = ibv_create_cq(ctx, 2 * BLKMW_WRS_PER_IO * q->depth, NULL, NULL, 0);
	if (!q->cq)
		goto err_pd;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = q->cq;
	qpa.recv_cq = q->cq;
	qpa.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- BIND_MW + SEND + LOCAL_INV = 3 per request, plus one */
	qpa.cap.max_send_wr = BLKMW_WRS_PER_IO * q->depth + 1; // BUG: rdma-send-queue-manual-factor -- depth multiplied by the ULP's own factor for BIND/INV WRs
	qpa.cap.max_recv_wr = q->depth;
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(q->pd, &qpa);
	if (!q->qp)
		goto err_cq;

	q->arena = aligned_alloc(4096, (size_t)q->depth * BLKMW_IO_MAX);
	if (!q->arena)
		goto err_qp;
	/* OK: rdma-access-flags-invalid -- windows granting remote write need LOCAL_WRITE and MW_BIND here, both set */
	/* OK: rdma-local-mr-management -- the MR under the windows has no remote rights; the window sites are the ones reported */
	q->data_mr = ibv_reg_mr(q->pd, q->arena, (size_t)q->depth * BLKMW_IO_MAX,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!q->data_mr)
		goto err_arena;

	msg_len = q->depth * (sizeof(struct blkmw_cmd) + sizeof(struct blkmw_rsp));
	q->cmds = calloc(1, msg_len);
	if (!q->cmds)
		goto err_data_mr;
	q->rsps = (struct blkmw_rsp *)(q->cmds + q->depth);
	/* OK: rdma-local-mr-management -- command/response ring, registered once for local access */
	q->msg_mr = ibv_reg_mr(q->pd, q->cmds, msg_len, IBV_ACCESS_LOCAL_WRITE);
	if (!q->msg_mr)
		goto err_cmds;

	for (i = 0; i < q->depth; i++) {
		struct blkmw_req *r = &q->reqs[i];

		r->q = q;
		r->tag = i;
		r->data = q->arena + (size_t)i * BLKMW_IO_MAX;
		r->mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- the ULP allocates its own windows to expose memory
		if (!r->mw)
			goto err_mws;
		r->rkey = r->mw->rkey;
		blkmw_put_req(q, r);
	}
	for (i = 0; i < q->depth; i++)
		if (blkmw_post_recv(q, i))
			goto err_all;
	return 0;

err_all:
	i = q->depth;
err_mws:
	/* OK: rdma-mr-leak -- every window allocated so far is released */
	while (i--)
		ibv_dealloc_mw(q->reqs[i].mw);
	ibv_dereg_mr(q->msg_mr);
err_cmds:
	free(q->cmds);
err_data_mr:
	ibv_dereg_mr(q->data_mr);
err_arena:
	free(q->arena);
err_qp:
	ibv_destroy_qp(q->qp);
err_cq:
	ibv_destroy_cq(q->cq);
err_pd:
	ibv_dealloc_pd(q->pd);
	return -ENOMEM;
}

int blkmw_submit(struct blkmw_queue *q, int op, uint64_t lba, uint32_t len,
		 void (*done)(struct blkmw_req *, int))
{
	struct blkmw_req *r;
	struct blkmw_cmd *cmd;
	struct ibv_send_wr *bad;
	int ret;

	if (len > BLKMW_IO_MAX)
		return -EINVAL;
	r = blkmw_get_req(q);
	if (!r)
		return -EAGAIN;

	r->done = done;
	r->rkey = ibv_inc_rkey(r->rkey); /* OK: rdma-rkey-reuse -- a fresh key for every bind */
	memset(&r->bind_wr, 0, sizeof(r->bind_wr));
	r->bind_wr.wr_id = (uintptr_t)r;
	r->bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-I/O window bind done by the ULP
	r->bind_wr.bind_mw.mw = r->mw;
	r->bind_wr.bind_mw.rkey = r->rkey;
	r->bind_wr.bind_mw.bind_info.mr = q->data_mr;
	r->bind_wr.bind_mw.bind_info.addr = (uintptr_t)r->data;
	r->bind_wr.bind_mw.bind_info.length = len;
	/* OK: rdma-access-flags-invalid -- data_mr has LOCAL_WRITE and MW_BIND */
	r->bind_wr.bind_mw.bind_info.mw_access_flags =
		op == BLKMW_OP_READ ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	r->bind_wr.next = &r->send_wr;

	cmd = &q->cmds[r->tag];
	cmd->opcode = op;
	cmd->tag = htobe32(r->tag);
	cmd->lba = htobe64(lba);
	cmd->addr = htobe64((uintptr_t)r->data);
	cmd->rkey = htobe32(r->rkey);
	cmd->len = htobe32(len);

	r->cmd_sge.addr = (uintptr_t)cmd;
	r->cmd_sge.length = sizeof(*cmd);
	r->cmd_sge.lkey = q->msg_mr->lkey;
	memset(&r->send_wr, 0, sizeof(r->send_wr));
	r->send_wr.wr_id = (uintptr_t)r;
	r->send_wr.opcode = IBV_WR_SEND;
	r->send_wr.sg_list = &r->cmd_sge;
	r->send_wr.num_sge = 1;
	r->send_wr.send_flags = IBV_SEND_SIGNALED;

	r->deadline = time(NULL) + 30;
	ret = ibv_post_send(q->qp, &r->bind_wr, &bad);
	if (ret) {
		/* OK: rdma-invalidation-leak -- the post failed, nothing was bound */
		blkmw_put_req(q, r);
		return -ret;
	}
	return 0;
}

static int blkmw_local_inv(struct blkmw_queue *q, struct blkmw_req *r)
{
	struct ibv_send_wr *bad;

	memset(&r->inv_wr, 0, sizeof(r->inv_wr));
	r->inv_wr.wr_id = (uintptr_t)r | BLKMW_INV_TAG;
	r->inv_wr.opcode = IBV_WR_LOCAL_INV;
	r->inv_wr.invalidate_rkey = r->rkey;
	r->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(q->qp, &r->inv_wr, &bad);
}

static void blkmw_finish(struct blkmw_queue *q, struct blkmw_req *r)
{
	r->done(r, r->status);
	/* OK: rdma-invalidation-leak -- reached only after the key was invalidated (checked SEND_WITH_INV or LOCAL_INV completion) */
	blkmw_put_req(q, r);
}

static void blkmw_fatal(struct blkmw_queue *q, const char *why)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };

	fprintf(stderr, "blkmw: %s, moving QP to error\n", why);
	ibv_modify_qp(q->qp, &attr, IBV_QP_STATE);
}

void blkmw_handle_wc(struct blkmw_queue *q, struct ibv_wc *wc)
{
	struct blkmw_req *r;
	uint32_t tag;

	if (wc->status != IBV_WC_SUCCESS) {
		blkmw_fatal(q, ibv_wc_status_str(wc->status));
		return;
	}
	if (wc->opcode == IBV_WC_LOCAL_INV) {
		r = (struct blkmw_req *)(uintptr_t)(wc->wr_id & ~BLKMW_INV_TAG);
		blkmw_finish(q, r);
		return;
	}
	if (wc->opcode != IBV_WC_RECV)
		return;

	tag = be32toh(q->rsps[wc->wr_id].tag);
	if (tag >= q->depth || !q->reqs[tag].busy) {
		blkmw_fatal(q, "bad tag in response");
		return;
	}
	r = &q->reqs[tag];
	r->status = be32toh(q->rsps[wc->wr_id].status);
	blkmw_post_recv(q, wc->wr_id);

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		/* OK: rdma-remote-invalidate-unchecked -- the invalidated key must be this request's */
		if (wc->invalidated_rkey != r->rkey) {
			blkmw_fatal(q, "target invalidated a foreign rkey");
			return;
		}
		blkmw_finish(q, r);
	} else if (blkmw_local_inv(q, r)) {
		blkmw_fatal(q, "cannot post LOCAL_INV");
	}
}

void blkmw_check_timeouts(struct blkmw_queue *q)
{
	time_t now = time(NULL);
	unsigned int i;

	for (i = 0; i < q->depth; i++) {
		struct blkmw_req *r = &q->reqs[i];

		if (!r->busy || r->deadline > now)
			continue;
		r->done(r, -ETIMEDOUT);
		// BUG: rdma-invalidation-leak -- the window over r->data is still bound; the target can write into the next I/O's slice
		blkmw_put_req(q, r);
	}
}

void blkmw_queue_destroy(struct blkmw_queue *q)
{
	unsigned int i;

	ibv_destroy_qp(q->qp);
	/* OK: rdma-invalidation-leak -- deallocating a window invalidates it */
	for (i = 0; i < q->depth; i++)
		ibv_dealloc_mw(q->reqs[i].mw);
	ibv_dereg_mr(q->msg_mr);
	ibv_dereg_mr(q->data_mr);
	free(q->cmds);
	free(q->arena);
	ibv_destroy_cq(q->cq);
	ibv_dealloc_pd(q->pd);
}
