/*
 * ta_rpc.h - small RPC library over RDMA (RC, rdma_cm)
 *
 * Requests and short replies travel as SENDs in pooled, pre-registered
 * message buffers.  A reply that does not fit a message is written by the
 * server straight into the caller's reply area:
 *
 *   - up to RPC_CHUNK_MAX bytes: the call slot's reply chunk (a slice of the
 *     connection's chunk area, registered LOCAL_WRITE | MW_BIND) exposed
 *     through the slot's type 2 memory window, bound per call.  The server
 *     ends the reply with SEND_WITH_INV of that window's rkey; otherwise the
 *     client posts a LOCAL_INV before the slot is reused.
 *   - larger: a per-call buffer registered with REMOTE_WRITE for the call's
 *     lifetime and deregistered when the call ends.
 *
 * Call slots and message buffers are per-connection pools (free lists).
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- this program was reviewed for key lifetime only
 */
#ifndef TA_RPC_H
#define TA_RPC_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define RPC_SLOTS		16
#define RPC_MSG_SIZE		4096
#define RPC_RECV_DEPTH		(2 * RPC_SLOTS)
#define RPC_CHUNK_MAX		(64 * 1024)

/* wr_id: kind in the top byte, slot or buffer index below */
#define RPC_WR_SEND		1ull
#define RPC_WR_RECV		2ull
#define RPC_WR_BIND		3ull
#define RPC_WR_INV		4ull
#define RPC_WRID(kind, idx)	(((kind) << 56) | (uint64_t)(idx))
#define RPC_WRID_KIND(id)	((id) >> 56)
#define RPC_WRID_IDX(id)	((uint32_t)(id))

enum rpc_call_state {
	RPC_IDLE,
	RPC_SENT,		/* request out, reply area exposed */
	RPC_INV_PENDING,	/* reply in, LOCAL_INV of the chunk in flight */
	RPC_DONE,		/* reply in, nothing exposed any more */
	RPC_FAILED,
};

enum { RPC_MSG_CALL = 1, RPC_MSG_REPLY, RPC_MSG_CANCEL, RPC_MSG_CANCEL_ACK };

struct rpc_hdr {
	uint32_t	xid;
	uint16_t	type;
	uint16_t	proc;
	uint32_t	status;
	uint32_t	reply_rkey;
	uint64_t	reply_addr;
	uint32_t	reply_len;
	uint32_t	payload_len;
};

struct rpc_msgbuf {
	struct rpc_msgbuf	*next;
	uint32_t		idx;
	char			*data;		/* RPC_MSG_SIZE bytes in send_area */
};

struct rpc_call {
	struct rpc_call		*next;
	uint32_t		slot;
	uint32_t		xid;
	enum rpc_call_state	state;
	int			status;
	int			cancelled;
	struct ibv_mw		*reply_mw;
	uint32_t		reply_rkey;
	char			*reply_chunk;	/* RPC_CHUNK_MAX bytes in chunk_area */
	void			*big_buf;
	struct ibv_mr		*big_mr;
	size_t			reply_len;
	struct rpc_msgbuf	*req;
};

struct rpc_conn {
	struct rdma_cm_id	*id;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	int			broken;
	uint32_t		next_xid;

	char			*send_area;
	struct ibv_mr		*send_mr;
	struct rpc_msgbuf	msgbufs[RPC_SLOTS];
	struct rpc_msgbuf	*free_msgbufs;

	char			*recv_area;
	struct ibv_mr		*recv_mr;

	char			*chunk_area;
	struct ibv_mr		*chunk_mr;

	struct rpc_call		calls[RPC_SLOTS];
	struct rpc_call		*free_calls;
};

static inline struct rpc_call *rpc_call_get(struct rpc_conn *c)
{
	struct rpc_call *call = c->free_calls;

	if (call) {
		c->free_calls = call->next;
		call->next = NULL;
		call->state = RPC_IDLE;
		call->cancelled = 0;
		call->xid = ++c->next_xid;
	}
	return call;
}

static inline void rpc_call_put(struct rpc_conn *c, struct rpc_call *call)
{
	if (call->req) {
		call->req->next = c->free_msgbufs;
		c->free_msgbufs = call->req;
		call->req = NULL;
	}
	call->state = RPC_IDLE;
	call->next = c->free_calls;
	c->free_calls = call;
}

static inline int rpc_post_inv(struct rpc_conn *c, struct rpc_call *call, int signaled)
{
	struct ibv_send_wr wr = {
		.wr_id		 = RPC_WRID(RPC_WR_INV, call->slot),
		.opcode		 = IBV_WR_LOCAL_INV,
		.send_flags	 = signaled ? IBV_SEND_SIGNALED : 0,
		.invalidate_rkey = call->reply_rkey,
	}, *bad;

	return ibv_post_send(c->qp, &wr, &bad);
}

/* ta_rpc_conn.c */
struct rpc_conn *rpc_conn_create(struct rdma_cm_id *id);
void rpc_conn_destroy(struct rpc_conn *c);
int rpc_conn_poll(struct rpc_conn *c);

/* ta_rpc_call.c */
int rpc_call_sync(struct rpc_conn *c, uint16_t proc, const void *args, size_t arglen,
		  void *reply, size_t replylen, int timeout_ms);
int rpc_call_async(struct rpc_conn *c, uint16_t proc, const void *args, size_t arglen,
		   size_t replylen, struct rpc_call **out);
int rpc_call_finish(struct rpc_conn *c, struct rpc_call *call, void *reply, size_t replylen);
int rpc_cancel(struct rpc_conn *c, struct rpc_call *call);

#endif /* TA_RPC_H */
