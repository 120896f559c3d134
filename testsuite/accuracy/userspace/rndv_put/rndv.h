/*
 * rndv: PUT-based rendezvous for large messages in an MPI-like library.
 * Receiver: on RTS, expose the receive buffer (REMOTE_WRITE) and answer
 * with CTS (addr, rkey); on FIN, deregister.  Sender: on CTS, RDMA-WRITE
 * the payload and send FIN.  rndv_proto.c holds the protocol steps and the
 * QP setup, rndv_progress.c the control-message posting (with completion
 * moderation) and the completion dispatch.
 */
#ifndef RNDV_H
#define RNDV_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#define RNDV_SQ_DEPTH	256
#define RNDV_SIG_EVERY	32
#define RNDV_SRC_CACHE	16

enum rndv_msg_type { RNDV_RTS = 1, RNDV_CTS, RNDV_FIN };

struct rndv_msg {
	uint32_t type;
	uint32_t tag;
	uint64_t sreq;
	uint64_t rreq;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct rndv_rreq {
	void          *buf;
	size_t         len;
	struct ibv_mr *mr;
	int            done;
};

struct rndv_sreq {
	const void    *buf;
	size_t         len;
	int            done;
};

struct rndv_src_ent {
	const void    *buf;
	size_t         len;
	struct ibv_mr *mr;
};

struct rndv_ep {
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *ctrl_mr;
	struct rndv_msg     ctrl[RNDV_SQ_DEPTH];
	unsigned int        ctrl_head;
	unsigned int        unsignaled;
	struct rndv_src_ent src_cache[RNDV_SRC_CACHE];
};

int rndv_post_ctrl(struct rndv_ep *ep, const struct rndv_msg *m);
int rndv_handle_rts(struct rndv_ep *ep, const struct rndv_msg *rts, struct rndv_rreq *r);
int rndv_handle_cts(struct rndv_ep *ep, const struct rndv_msg *cts);
void rndv_handle_fin(struct rndv_ep *ep, const struct rndv_msg *fin);

#endif
