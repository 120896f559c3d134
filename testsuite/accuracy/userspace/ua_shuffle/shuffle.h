/*
 * shuffle.h - RDMA block transfer for a shuffle stage (shuffle_conn.c,
 * shuffle_server.c, shuffle_fetch.c): servers answer a FETCH with one
 * (addr, len, rkey) per block, reducers pull with RDMA READ and RELEASE.
 */
#ifndef SHUFFLE_H
#define SHUFFLE_H

#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SHUF_MAX_INFLIGHT	64	/* FETCH requests in flight per connection */
#define SHUF_MAX_BLOCKS		8	/* blocks per FETCH */
#define SHUF_RECV_DEPTH		4096
#define SHUF_QKEY		0x5f5f0001

enum shuf_msg_type { SHUF_FETCH = 1, SHUF_FETCH_REPLY, SHUF_RELEASE, SHUF_PUSH_READY, SHUF_HEARTBEAT };

struct shuf_block_desc { uint64_t block_id, addr; uint32_t len, rkey; };

struct shuf_msg {
	uint32_t		type, fetch_id, nblocks, status;
	struct shuf_block_desc	blocks[SHUF_MAX_BLOCKS];
};

struct shuf_dev {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_device_attr	attr;
};

struct shuf_conn {
	struct shuf_dev		*dev;
	struct rdma_cm_id	*id;
	struct ibv_qp		*qp, *hb_qp;	/* hb_qp: UD, heartbeats only */
	struct ibv_cq		*cq, *hb_cq;
	struct shuf_msg		*rx;
	struct ibv_mr		*rx_mr;
	uint32_t		rx_depth, max_inline;
	void			*priv;		/* server or reducer state */
};

/* shuffle_conn.c */
int shuf_dev_open(struct shuf_dev *dev);
int shuf_conn_create(struct shuf_dev *dev, struct rdma_cm_id *id, struct shuf_conn *conn);
void shuf_conn_destroy(struct shuf_conn *conn);
int shuf_send(struct shuf_conn *conn, struct shuf_msg *msg, int signaled);
int shuf_heartbeat(struct shuf_conn *conn, struct ibv_ah *ah, uint32_t remote_qpn);

/* shuffle_server.c */
int srv_init(struct shuf_conn *conn, const char *dir);
int srv_handle_msg(struct shuf_conn *conn, struct shuf_msg *msg);
void srv_conn_cleanup(struct shuf_conn *conn);

/* shuffle_fetch.c */
int fetch_init(struct shuf_conn *conn, int push_mode);
int fetch_issue(struct shuf_conn *conn, const struct shuf_msg *reply);
void fetch_complete(struct shuf_conn *conn, struct ibv_wc *wc);

#endif
