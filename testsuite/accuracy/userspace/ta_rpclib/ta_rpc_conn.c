/*
 * ta_rpc_conn.c - connection setup, completion dispatch and teardown
 *
 * The reply handlers decide when a call's reply chunk is no longer exposed:
 * a SEND_WITH_INV naming the slot's current rkey, or the completion of our
 * own LOCAL_INV.  Only then does a call reach RPC_DONE.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ta_rpc.h"

#define rpc_log(fmt, ...) fprintf(stderr, "rpc: " fmt "\n", ##__VA_ARGS__)

static int rpc_post_recv(struct rpc_conn *c, uint32_t idx)
{
	struct ibv_sge sge = {
		.addr	= (uintptr_t)(c->recv_area + (size_t)idx * RPC_MSG_SIZE),
		.length	= RPC_MSG_SIZE,
		.lkey	= c->recv_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = RPC_WRID(RPC_WR_RECV, idx), .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

static struct rpc_call *rpc_find_call(struct rpc_conn *c, uint32_t xid)
{
	for (int i = 0; i < RPC_SLOTS; i++)
		if (c->calls[i].state != RPC_IDLE && c->calls[i].xid == xid)
			return &c->calls[i];
	return NULL;
}

static void rpc_handle_reply(struct rpc_conn *c, struct ibv_wc *wc, struct rpc_hdr *hdr)
{
	struct rpc_call *call = rpc_find_call(c, hdr->xid);

	if (!call || call->state != RPC_SENT) {
		rpc_log("stray reply xid %u", hdr->xid);
		return;
	}
	call->status = (int)hdr->status;
	call->reply_len = hdr->payload_len;

	if (call->big_mr) {
		/* a plain MR cannot be invalidated remotely; the caller deregisters it */
		call->state = RPC_DONE;
		return;
	}

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (wc->invalidated_rkey == call->reply_rkey) {
			call->state = RPC_DONE; /* OK: rdma-remote-invalidate-unchecked -- the server invalidated this slot's current rkey */
			return;
		}
		rpc_log("xid %u: server invalidated rkey 0x%x, chunk uses 0x%x",
			hdr->xid, wc->invalidated_rkey, call->reply_rkey);
	}

	if (rpc_post_inv(c, call, 1)) {
		call->state = RPC_FAILED;
		c->broken = 1;
		return;
	}
	call->state = RPC_INV_PENDING;
}

static void rpc_handle_cancel_ack(struct rpc_conn *c, struct ibv_wc *wc, struct rpc_hdr *hdr)
{
	struct rpc_call *call = rpc_find_call(c, hdr->xid);

	if (!call || !call->cancelled)
		return;

	if (call->big_mr) {
		ibv_dereg_mr(call->big_mr);
		call->big_mr = NULL;
		free(call->big_buf);
		call->big_buf = NULL;
		rpc_call_put(c, call); /* OK: rdma-invalidation-leak -- the reply buffer's MR was deregistered */
		return;
	}

	/* the server drops the reply chunk with its acknowledgement */
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		rpc_call_put(c, call); /* BUG: rdma-remote-invalidate-unchecked -- the invalidated rkey is not compared with call->reply_rkey */
		return;
	}

	if (rpc_post_inv(c, call, 1)) {
		c->broken = 1;
		return;
	}
	call->state = RPC_INV_PENDING;
}

static void rpc_handle_inv_done(struct rpc_conn *c, struct ibv_wc *wc)
{
	struct rpc_call *call = &c->calls[RPC_WRID_IDX(wc->wr_id) % RPC_SLOTS];

	if (wc->status != IBV_WC_SUCCESS) {
		rpc_log("LOCAL_INV of slot %u failed: %s", call->slot, ibv_wc_status_str(wc->status));
		call->state = RPC_FAILED;
		c->broken = 1;
		return;
	}
	if (call->cancelled) {
		rpc_call_put(c, call); /* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
		return;
	}
	call->state = RPC_DONE;
}

int rpc_conn_poll(struct rpc_conn *c)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(c->cq, 16, wc);
	if (n < 0)
		return -EIO;

	for (i = 0; i < n; i++) {
		uint64_t kind = RPC_WRID_KIND(wc[i].wr_id);
		uint32_t idx = RPC_WRID_IDX(wc[i].wr_id);
		struct rpc_hdr *hdr;

		if (kind == RPC_WR_INV) {
			rpc_handle_inv_done(c, &wc[i]);
			continue;
		}
		if (wc[i].status != IBV_WC_SUCCESS) {
			if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
				rpc_log("wr 0x%llx failed: %s", (unsigned long long)wc[i].wr_id,
					ibv_wc_status_str(wc[i].status));
			c->broken = 1;
			continue;
		}
		if (kind != RPC_WR_RECV)
			continue;

		hdr = (struct rpc_hdr *)(c->recv_area + (size_t)idx * RPC_MSG_SIZE);
		if (hdr->type == RPC_MSG_REPLY)
			rpc_handle_reply(c, &wc[i], hdr);
		else if (hdr->type == RPC_MSG_CANCEL_ACK)
			rpc_handle_cancel_ack(c, &wc[i], hdr);
		if (rpc_post_recv(c, idx))
			c->broken = 1;
	}
	return n;
}

struct rpc_conn *rpc_conn_create(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qpa = { 0 };
	struct rpc_conn *c;
	int i;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	if (!c->pd)
		goto err_free;
	c->cq = ibv_create_cq(id->verbs, 3 * RPC_SLOTS + RPC_RECV_DEPTH, c, NULL, 0);
	if (!c->cq)
		goto err_pd;

	qpa.send_cq = qpa.recv_cq = c->cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.cap.max_send_wr = 3 * RPC_SLOTS;
	qpa.cap.max_recv_wr = RPC_RECV_DEPTH;
	qpa.cap.max_send_sge = qpa.cap.max_recv_sge = 1;
	qpa.cap.max_inline_data = sizeof(struct rpc_hdr);
	if (rdma_create_qp(id, c->pd, &qpa))
		goto err_cq;
	c->qp = id->qp;

	c->send_area = calloc(RPC_SLOTS, RPC_MSG_SIZE);
	c->recv_area = calloc(RPC_RECV_DEPTH, RPC_MSG_SIZE);
	c->chunk_area = aligned_alloc(4096, (size_t)RPC_SLOTS * RPC_CHUNK_MAX);
	if (!c->send_area || !c->recv_area || !c->chunk_area)
		goto err_areas;
	c->send_mr = ibv_reg_mr(c->pd, c->send_area, RPC_SLOTS * RPC_MSG_SIZE, 0);
	c->recv_mr = ibv_reg_mr(c->pd, c->recv_area, RPC_RECV_DEPTH * RPC_MSG_SIZE,
				IBV_ACCESS_LOCAL_WRITE);
	c->chunk_mr = ibv_reg_mr(c->pd, c->chunk_area, (size_t)RPC_SLOTS * RPC_CHUNK_MAX,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!c->send_mr || !c->recv_mr || !c->chunk_mr)
		goto err_mrs;

	for (i = 0; i < RPC_SLOTS; i++) {
		struct rpc_call *call = &c->calls[i];

		call->slot = i;
		call->reply_chunk = c->chunk_area + (size_t)i * RPC_CHUNK_MAX;
		call->reply_mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
		if (!call->reply_mw)
			goto err_mws;
		call->reply_rkey = call->reply_mw->rkey;
		rpc_call_put(c, call);

		c->msgbufs[i].idx = i;
		c->msgbufs[i].data = c->send_area + (size_t)i * RPC_MSG_SIZE;
		c->msgbufs[i].next = c->free_msgbufs;
		c->free_msgbufs = &c->msgbufs[i];
	}
	for (i = 0; i < RPC_RECV_DEPTH; i++)
		if (rpc_post_recv(c, i))
			goto err_recv;
	return c;

err_recv:
	i = RPC_SLOTS;
err_mws:
	while (--i >= 0)
		ibv_dealloc_mw(c->calls[i].reply_mw);
err_mrs:
	if (c->chunk_mr)
		ibv_dereg_mr(c->chunk_mr);
	if (c->recv_mr)
		ibv_dereg_mr(c->recv_mr);
	if (c->send_mr)
		ibv_dereg_mr(c->send_mr);
err_areas:
	free(c->chunk_area);
	free(c->recv_area);
	free(c->send_area);
	rdma_destroy_qp(id);
err_cq:
	ibv_destroy_cq(c->cq);
err_pd:
	ibv_dealloc_pd(c->pd);
err_free:
	free(c);
	return NULL;
}

void rpc_conn_destroy(struct rpc_conn *c)
{
	struct ibv_wc wc;
	int pending = 0, i;

	/* kill every reply chunk that is still exposed before tearing down */
	for (i = 0; i < RPC_SLOTS; i++) {
		struct rpc_call *call = &c->calls[i];

		if (call->state != RPC_SENT || call->big_mr)
			continue;
		call->cancelled = 0;
		if (rpc_post_inv(c, call, 1) == 0) {
			call->state = RPC_INV_PENDING;
			pending++;
		}
	}
	while (pending > 0) {
		int n = ibv_poll_cq(c->cq, 1, &wc);

		if (n < 0)
			break;
		if (n == 1 && RPC_WRID_KIND(wc.wr_id) == RPC_WR_INV) {
			rpc_handle_inv_done(c, &wc);
			pending--;
		}
	}

	for (i = 0; i < RPC_SLOTS; i++) {
		struct rpc_call *call = &c->calls[i];

		if (call->big_mr) {
			ibv_dereg_mr(call->big_mr);
			free(call->big_buf); /* OK: rdma-invalidation-leak -- deregistered just before */
		}
		if (call->state == RPC_DONE)
			rpc_call_put(c, call); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- reached only once the slot's LOCAL_INV completed */
		ibv_dealloc_mw(call->reply_mw);
	}

	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->chunk_mr);
	free(c->chunk_area); /* OK: rdma-invalidation-leak -- every window over it was deallocated above */
	ibv_dereg_mr(c->recv_mr);
	free(c->recv_area);
	ibv_dereg_mr(c->send_mr);
	free(c->send_area);
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->pd);
	free(c);
}
