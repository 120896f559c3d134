/*
 * kvsrv - a small key/value server over rdma_cm.
 *
 * One listening cm_id, one PD, one CQ and one shared receive queue for all
 * clients; each accepted client gets its own RC QP (attached to the SRQ) and
 * a slot in srv->conns[].  Requests arrive as SENDs into the SRQ:
 *
 *   GET       value is RDMA-WRITten into the client's buffer, then a
 *             response SEND (chain op->wr[0] -> op->wr[1]);
 *   PUT       the server binds one of the connection's type-2 windows over
 *             a store slot (REMOTE_WRITE) and SENDs the grant;
 *   PUT_MORE  the client filled the slice and wants the next one: the
 *             window is rebound to the next slice of the slot;
 *   PUT_DONE  the client finished; it normally SEND_WITH_INVs the window,
 *             otherwise the server posts LOCAL_INV before the ack.
 *
 * Every post reserves its work requests from conn->sq_credits, which
 * starts at KV_SQ_DEPTH (the send queue size) and is given back by the
 * completion of the op's signaled WR.  Eviction notices go to every client;
 * they are signaled in batches of KV_NOTIFY_SIGNAL_EVERY.
 *
 * Files: kvsrv_main.c (device, SRQ, cm events, per-connection QPs),
 * kvsrv_io.c (request handling and posting).
 *
 * Known problems: notify_budget is never counted down, so eviction notices
 * are never signaled and their entries and credits never come back;
 * PUT_MORE rebinds the window without a new key; the connection QP asks
 * for KV_MAX_SGE send SGEs without looking at max_sge.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked, rdma-access-flags-invalid,
 *   rdma-access-flags-transport, rdma-remote-access-overbroad,
 *   rdma-registration-in-datapath, rdma-local-mr-management,
 *   rdma-send-queue-manual-factor -- not covered by this program's annotations
 */
#ifndef KVSRV_H
#define KVSRV_H

#include <stdint.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define KV_MAX_CONNS		32
#define KV_SQ_DEPTH		256
#define KV_SRQ_DEPTH		4096
#define KV_MAX_SGE		8	/* multi-get gathers up to 8 values */
#define KV_OPS_PER_CONN		128
#define KV_NR_WINDOWS		16
#define KV_SLOT_SIZE		(1u << 20)
#define KV_NR_SLOTS		256
#define KV_SLICE_SIZE		(256u << 10)
#define KV_NOTIFY_SIGNAL_EVERY	32
#define KV_PENDING_MAX		64

enum kv_opcode {
	KV_OP_GET = 1,
	KV_OP_PUT,
	KV_OP_PUT_MORE,
	KV_OP_PUT_DONE,
	KV_OP_NOTIFY,
	KV_OP_RESP,
};

struct kv_msg {
	uint32_t	op;
	uint32_t	tag;
	uint64_t	key;
	uint64_t	addr;
	uint32_t	rkey;
	uint32_t	len;
	int32_t		status;
	uint32_t	win;
};

struct kv_conn;

struct kv_win {
	struct ibv_mw	*mw;
	uint32_t	key;		/* rkey of the current/last binding */
	int		busy;
	uint32_t	slot;
	uint32_t	slice;
	uint64_t	kv_key;
};

struct kv_op {
	struct kv_op		*next_free;
	struct kv_conn		*conn;
	uint32_t		sq_cost;	/* credits given back on completion */
	struct kv_win		*win;
	int			release_win;	/* window is free once this completes */
	struct ibv_sge		sge[KV_MAX_SGE];
	struct ibv_send_wr	wr[3];
	struct kv_msg		rsp;
};

struct kv_server;

struct kv_conn {
	int			in_use;
	struct kv_server	*srv;
	struct rdma_cm_id	*id;
	struct ibv_qp		*qp;
	uint32_t		sq_credits;
	uint32_t		notify_budget;	/* notices left before the next signaled one */
	uint32_t		notify_unsig;	/* unsignaled notices since the last signaled one */
	struct kv_op		*free_ops;
	struct kv_op		ops[KV_OPS_PER_CONN];
	struct kv_win		wins[KV_NR_WINDOWS];
	unsigned		npending;
	struct kv_msg		pending[KV_PENDING_MAX];
	uint8_t			pending_inv[KV_PENDING_MAX];	/* peer invalidated the window */
};

struct kv_server {
	struct rdma_event_channel	*ec;
	struct rdma_cm_id		*listen_id;
	struct ibv_context		*verbs;
	struct ibv_pd			*pd;
	struct ibv_cq			*cq;
	struct ibv_srq			*srq;
	struct ibv_device_attr		dev_attr;
	uint32_t			srq_depth;
	struct ibv_mr			*rx_mr;
	struct kv_msg			*rx;
	struct ibv_mr			*store_mr;	/* LOCAL_WRITE | MW_BIND */
	char				*store;
	uint64_t			slot_key[KV_NR_SLOTS];
	uint32_t			slot_len[KV_NR_SLOTS];
	uint64_t			notices;
	struct kv_conn			conns[KV_MAX_CONNS];
};

/* kvsrv_io.c */
int kv_srq_post(struct kv_server *srv, uint32_t slot);
void kv_conn_init_ops(struct kv_conn *c);
int kv_process_cq(struct kv_server *srv);
void kv_notify_evict(struct kv_server *srv, uint64_t kv_key);

/* kvsrv_main.c */
struct kv_conn *kv_conn_by_qpn(struct kv_server *srv, uint32_t qpn);

#endif /* KVSRV_H */
