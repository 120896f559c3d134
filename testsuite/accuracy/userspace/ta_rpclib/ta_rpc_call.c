/*
 * ta_rpc_call.c - issuing calls
 *
 * A call takes a slot and a message buffer from the connection's pools,
 * exposes its reply area (the slot's window, or a per-call registration
 * for oversized replies), sends the request and waits for the reply
 * handler in ta_rpc_conn.c to move the slot to RPC_DONE.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ta_rpc.h"

static struct rpc_msgbuf *rpc_msgbuf_get(struct rpc_conn *c)
{
	struct rpc_msgbuf *m = c->free_msgbufs;

	if (m)
		c->free_msgbufs = m->next;
	return m;
}

static struct rpc_hdr *rpc_fill_request(struct rpc_call *call, uint16_t proc,
					const void *args, size_t arglen)
{
	struct rpc_hdr *hdr = (struct rpc_hdr *)call->req->data;

	memset(hdr, 0, sizeof(*hdr));
	hdr->xid = call->xid;
	hdr->type = RPC_MSG_CALL;
	hdr->proc = proc;
	hdr->payload_len = (uint32_t)arglen;
	memcpy(hdr + 1, args, arglen);
	return hdr;
}

/* 0: posted; -EIO: nothing posted; -EINPROGRESS: only the bind went out */
static int rpc_post_request(struct rpc_conn *c, struct rpc_call *call, struct ibv_send_wr *bind)
{
	struct rpc_hdr *hdr = (struct rpc_hdr *)call->req->data;
	struct ibv_sge sge = {
		.addr	= (uintptr_t)hdr,
		.length	= (uint32_t)(sizeof(*hdr) + hdr->payload_len),
		.lkey	= c->send_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id		= RPC_WRID(RPC_WR_SEND, call->req->idx),
		.sg_list	= &sge,
		.num_sge	= 1,
		.opcode		= IBV_WR_SEND,
		.send_flags	= IBV_SEND_SIGNALED,
	}, *bad = NULL;

	if (bind)
		bind->next = &wr;
	if (ibv_post_send(c->qp, bind ? bind : &wr, &bad) == 0)
		return 0;
	return (bind && bad != bind) ? -EINPROGRESS : -EIO;
}

static void rpc_prepare_chunk(struct rpc_conn *c, struct rpc_call *call, size_t len,
			      struct ibv_send_wr *bind)
{
	call->reply_rkey = ibv_inc_rkey(call->reply_rkey);

	memset(bind, 0, sizeof(*bind));
	bind->wr_id = RPC_WRID(RPC_WR_BIND, call->slot);
	bind->opcode = IBV_WR_BIND_MW;
	bind->bind_mw.mw = call->reply_mw;
	bind->bind_mw.rkey = call->reply_rkey; /* OK: rdma-rkey-reuse -- rotated at the top of this function */
	bind->bind_mw.bind_info.mr = c->chunk_mr;
	bind->bind_mw.bind_info.addr = (uintptr_t)call->reply_chunk;
	bind->bind_mw.bind_info.length = len;
	bind->bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
}

static int rpc_wait(struct rpc_conn *c, struct rpc_call *call, int timeout_ms)
{
	struct timespec start, now;

	clock_gettime(CLOCK_MONOTONIC, &start);
	while (call->state == RPC_SENT || call->state == RPC_INV_PENDING) {
		if (c->broken || rpc_conn_poll(c) < 0)
			return -EIO;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) * 1000 +
		    (now.tv_nsec - start.tv_nsec) / 1000000 > timeout_ms)
			return -ETIMEDOUT;
	}
	return call->state == RPC_DONE ? 0 : -EIO;
}

int rpc_call_sync(struct rpc_conn *c, uint16_t proc, const void *args, size_t arglen,
		  void *reply, size_t replylen, int timeout_ms)
{
	struct rpc_call *call;
	struct rpc_hdr *hdr;
	struct ibv_send_wr bind;
	int rc;

	if (arglen > RPC_MSG_SIZE - sizeof(*hdr))
		return -EMSGSIZE;
	call = rpc_call_get(c);
	if (!call)
		return -EAGAIN;
	call->req = rpc_msgbuf_get(c);
	if (!call->req) {
		rpc_call_put(c, call);
		return -EAGAIN;
	}
	hdr = rpc_fill_request(call, proc, args, arglen);

	if (replylen > RPC_CHUNK_MAX) {
		call->big_buf = malloc(replylen);
		if (!call->big_buf)
			goto err_put;
		call->big_mr = ibv_reg_mr(c->pd, call->big_buf, replylen,
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!call->big_mr) {
			free(call->big_buf);
			goto err_put;
		}
		hdr->reply_rkey = call->big_mr->rkey;
		hdr->reply_addr = (uintptr_t)call->big_buf;
		hdr->reply_len = (uint32_t)replylen;
		rc = rpc_post_request(c, call, NULL);
		if (rc) {
			free(call->big_buf); /* BUG: rdma-invalidation-leak -- the buffer goes back to malloc while its REMOTE_WRITE registration is never undone */
			call->big_buf = NULL;
			call->big_mr = NULL;
			rpc_call_put(c, call);
			return rc;
		}
	} else {
		rpc_prepare_chunk(c, call, replylen, &bind);
		hdr->reply_rkey = call->reply_rkey;
		hdr->reply_addr = (uintptr_t)call->reply_chunk;
		hdr->reply_len = (uint32_t)replylen;
		rc = rpc_post_request(c, call, &bind);
		if (rc == -EIO) {
			rpc_call_put(c, call); /* OK: rdma-invalidation-leak -- the bind was the WR that failed, nothing is exposed */
			return rc;
		}
		if (rc) {
			c->broken = 1;	/* window bound, request lost: slot stays busy */
			return -EIO;
		}
	}
	call->state = RPC_SENT;

	rc = rpc_wait(c, call, timeout_ms);
	if (rc == -ETIMEDOUT) {
		if (call->big_mr) {
			free(call->big_buf); /* BUG: rdma-invalidation-leak -- freed while the server may still write through big_mr; the dereg comes after */
			ibv_dereg_mr(call->big_mr);
			call->big_mr = NULL;
		} else {
			rpc_post_inv(c, call, 0);
		}
		rpc_call_put(c, call); /* BUG: rdma-unmap-before-invalidate -- the chunk's unsignaled LOCAL_INV may still be queued when the slot is reused */
		return rc;
	}
	if (rc)
		return rc;	/* connection broken: slots are reclaimed at destroy */

	if (call->big_mr) {
		memcpy(reply, call->big_buf, call->reply_len < replylen ? call->reply_len : replylen);
		ibv_dereg_mr(call->big_mr);
		call->big_mr = NULL;
		free(call->big_buf); /* OK: rdma-invalidation-leak -- deregistered first */
		call->big_buf = NULL;
	} else {
		memcpy(reply, call->reply_chunk, call->reply_len < replylen ? call->reply_len : replylen);
	}
	rc = call->status;
	rpc_call_put(c, call); /* OK: rdma-invalidation-leak -- rpc_wait() returns 0 only in RPC_DONE, after the chunk's key was checked dead or LOCAL_INV completed */
	return rc;

err_put:
	rpc_call_put(c, call);
	return -ENOMEM;
}

int rpc_call_async(struct rpc_conn *c, uint16_t proc, const void *args, size_t arglen,
		   size_t replylen, struct rpc_call **out)
{
	struct rpc_call *call;
	struct rpc_hdr *hdr;
	struct ibv_send_wr bind = { 0 };
	int rc;

	if (replylen > RPC_CHUNK_MAX || arglen > RPC_MSG_SIZE - sizeof(*hdr))
		return -EMSGSIZE;
	call = rpc_call_get(c);
	if (!call)
		return -EAGAIN;
	call->req = rpc_msgbuf_get(c);
	if (!call->req) {
		rpc_call_put(c, call);
		return -EAGAIN;
	}
	hdr = rpc_fill_request(call, proc, args, arglen);

	bind.wr_id = RPC_WRID(RPC_WR_BIND, call->slot);
	bind.opcode = IBV_WR_BIND_MW;
	bind.bind_mw.mw = call->reply_mw;
	bind.bind_mw.rkey = call->reply_rkey; /* BUG: rdma-rkey-reuse -- the slot's previous call already handed this rkey to the server */
	bind.bind_mw.bind_info.mr = c->chunk_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)call->reply_chunk;
	bind.bind_mw.bind_info.length = replylen;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	hdr->reply_rkey = call->reply_rkey;
	hdr->reply_addr = (uintptr_t)call->reply_chunk;
	hdr->reply_len = (uint32_t)replylen;
	rc = rpc_post_request(c, call, &bind);
	if (rc == -EIO) {
		rpc_call_put(c, call); /* OK: rdma-invalidation-leak -- nothing was posted */
		return rc;
	}
	if (rc) {
		c->broken = 1;
		return -EIO;
	}
	call->state = RPC_SENT;
	*out = call;
	return 0;
}

int rpc_call_finish(struct rpc_conn *c, struct rpc_call *call, void *reply, size_t replylen)
{
	int rc;

	if (call->state == RPC_SENT || call->state == RPC_INV_PENDING)
		return -EAGAIN;
	if (call->state != RPC_DONE)
		return -EIO;

	memcpy(reply, call->reply_chunk, call->reply_len < replylen ? call->reply_len : replylen);
	rc = call->status;
	rpc_call_put(c, call); /* OK: rdma-invalidation-leak -- only RPC_DONE slots get here, their window is dead */
	return rc;
}

int rpc_cancel(struct rpc_conn *c, struct rpc_call *call)
{
	struct rpc_hdr hdr = { .xid = call->xid, .type = RPC_MSG_CANCEL };
	struct ibv_sge sge = { .addr = (uintptr_t)&hdr, .length = sizeof(hdr) };
	struct ibv_send_wr wr = {
		.wr_id		= RPC_WRID(RPC_WR_SEND, RPC_SLOTS + call->slot),
		.sg_list	= &sge,
		.num_sge	= 1,
		.opcode		= IBV_WR_SEND,
		.send_flags	= IBV_SEND_SIGNALED | IBV_SEND_INLINE,
	}, *bad;

	if (call->state != RPC_SENT)
		return -EINVAL;
	call->cancelled = 1;
	if (ibv_post_send(c->qp, &wr, &bad)) {
		call->cancelled = 0;
		return -EIO;
	}
	return 0;
}
