/*
 * repl: log shipping from a key-value primary to its replicas.
 * repl_conn.c sets up a replica connection (QP, log and ack buffers, post
 * accounting); repl_ship.c ships log records (RDMA WRITE into the
 * replica's log, then a SEND announcing the new tail).
 */
#ifndef REPL_H
#define REPL_H

#include <infiniband/verbs.h>
#include <stdint.h>

#define REPL_DEPTH	64
#define REPL_SIG_EVERY	16

struct repl_conn {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	char               *log;
	size_t              log_len;
	struct ibv_mr      *log_mr;
	uint64_t           *ack_page;
	struct ibv_mr      *ack_mr;
	unsigned int        depth;
	unsigned int        unsig;
	uint64_t            posted;
	uint64_t            remote_log;
	uint32_t            remote_log_rkey;
	uint64_t            tail_msg;
};

int repl_conn_setup(struct repl_conn *c);
void repl_account_post(struct repl_conn *c);
int repl_ship(struct repl_conn *c, uint64_t off, uint32_t len);

#endif
