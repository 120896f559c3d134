/*
 * tgt_io.c: queue pair, command handling and data movement of the block
 * target.
 *
 * Correct: the send queue holds two work requests per command slot (one
 * data WR and the response SEND; this file posts no registration or
 * invalidation, so the factor is not a registration factor); responses are
 * signaled.
 * Not correct:
 *  - the RDMA READ that fetches a host's write data lands in a pool buffer
 *    registered LOCAL_WRITE only (tgt_mem.c): fails on iWARP;
 *  - the send queue asks for TGT_MAX_SGE (8) send SGEs without comparing
 *    with the device's max_sge.
 */
#include "tgt.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

struct tgt_cmd {
	uint32_t op;
	uint32_t tag;
	uint64_t lba;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct tgt_rsp {
	uint32_t tag;
	int32_t  status;
};

struct tgt_ctx {
	struct tgt_cmd    *cmd;
	struct tgt_buf    *buf;
	struct tgt_rsp     rsp;
	struct ibv_sge     data_sge, rsp_sge;
	struct ibv_send_wr data_wr, rsp_wr;
};

struct tgt_conn {
	struct ibv_pd   *pd;
	struct ibv_cq   *cq;
	struct ibv_qp   *qp;
	struct ibv_mr   *rsp_mr;
	struct tgt_pool *pool;
	struct tgt_ctx   ctx[TGT_DEPTH];
};

int tgt_conn_qp(struct tgt_conn *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- one data WR + one response per slot; no registration WRs */
	attr.cap.max_send_wr = 2 * TGT_DEPTH;
	attr.cap.max_recv_wr = TGT_DEPTH;
	attr.cap.max_send_sge = TGT_MAX_SGE; // BUG: rdma-queue-cap-unchecked -- 8 send SGEs without comparing with max_sge
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

static void tgt_prep_rsp(struct tgt_conn *c, struct tgt_ctx *x, int status)
{
	x->rsp.tag = x->cmd->tag;
	x->rsp.status = (int32_t)htobe32((uint32_t)status);
	x->rsp_sge = (struct ibv_sge){ (uintptr_t)&x->rsp, sizeof(x->rsp), c->rsp_mr->lkey };
	memset(&x->rsp_wr, 0, sizeof(x->rsp_wr));
	x->rsp_wr.wr_id = (uintptr_t)x;
	x->rsp_wr.opcode = IBV_WR_SEND;
	x->rsp_wr.sg_list = &x->rsp_sge;
	x->rsp_wr.num_sge = 1;
	x->rsp_wr.send_flags = IBV_SEND_SIGNALED;
}

int tgt_exec(struct tgt_conn *c, struct tgt_ctx *x)
{
	struct ibv_send_wr *bad;
	uint32_t len = be32toh(x->cmd->len);

	x->buf = tgt_buf_get(c->pool);
	if (!x->buf || len > TGT_BUF_SIZE)
		return -EAGAIN;
	x->data_sge = (struct ibv_sge){ (uintptr_t)x->buf->data, len, c->pool->mr->lkey };
	memset(&x->data_wr, 0, sizeof(x->data_wr));
	x->data_wr.wr_id = (uintptr_t)x;
	x->data_wr.sg_list = &x->data_sge;
	x->data_wr.num_sge = 1;
	x->data_wr.wr.rdma.remote_addr = be64toh(x->cmd->addr);
	x->data_wr.wr.rdma.rkey = be32toh(x->cmd->rkey);

	if (be32toh(x->cmd->op) == 0) {		/* host reads: WRITE the data, then respond */
		x->data_wr.opcode = IBV_WR_RDMA_WRITE;
		tgt_prep_rsp(c, x, 0);
		x->data_wr.next = &x->rsp_wr;
		return ibv_post_send(c->qp, &x->data_wr, &bad);
	}
	/* host writes: fetch the data first */
	x->data_wr.opcode = IBV_WR_RDMA_READ;
	x->data_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &x->data_wr, &bad); // BUG: rdma-access-flags-transport -- the READ sink is the pool, registered without REMOTE_WRITE (tgt_mem.c); fails on iWARP
}

int tgt_fetched(struct tgt_conn *c, struct tgt_ctx *x, int status)
{
	struct ibv_send_wr *bad;

	tgt_prep_rsp(c, x, status);
	return ibv_post_send(c->qp, &x->rsp_wr, &bad);
}

void tgt_rsp_done(struct tgt_conn *c, struct tgt_ctx *x)
{
	tgt_buf_put(c->pool, x->buf);
	x->buf = NULL;
}
