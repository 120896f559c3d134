/*
 * rdma_stack.h - shared definitions of the async messenger's RDMA stack.
 *
 * The stack owns one device context (protection domain, TX and RX
 * completion queues) and a pool of pre-registered message chunks; every
 * connection is an RC queue pair whose messages are copied into chunks.
 * Large zero-copy sends register the caller's segments instead.
 */
#ifndef RDMA_STACK_H
#define RDMA_STACK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <infiniband/verbs.h>

#define MSGR_CHUNK_SIZE         (128 * 1024)
#define MSGR_TX_QUEUE_LEN       4096
#define MSGR_RX_QUEUE_LEN       1024
#define MSGR_MAX_SGE            8
#define MSGR_SIGNAL_EVERY       64
#define MSGR_ZC_THRESHOLD       (4 * MSGR_CHUNK_SIZE)
#define MSGR_WRID_ZC_BIT        1ULL

struct msgr_chunk {
	struct msgr_chunk	*next;
	char			*buf;
	uint32_t		lkey;
	uint32_t		bound;		/* bytes used */
};

struct msgr_cluster {
	struct msgr_cluster	*next;
	char			*base;
	struct ibv_mr		*mr;
	unsigned int		nchunks;
	struct msgr_chunk	chunks[];
};

struct msgr_pool {
	struct ibv_pd		*pd;
	struct msgr_cluster	*clusters;
	struct msgr_chunk	*free;
	unsigned int		nfree;
};

struct msgr_ib {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_comp_channel	*chan;
	struct ibv_cq		*tx_cq;
	struct ibv_cq		*rx_cq;
	struct ibv_device_attr	dev_attr;
	struct msgr_pool	pool;
};

struct msgr_zc {
	unsigned int		nmrs;
	struct ibv_mr		*mrs[MSGR_MAX_SGE];
};

struct msgr_conn {
	struct msgr_ib		*ib;
	struct ibv_qp		*qp;
	unsigned int		tx_credits;
	unsigned int		unsignaled;	/* WRs posted since the last signaled one */
	unsigned int		max_sge;
	struct ibv_send_wr	tx_wrs[MSGR_MAX_SGE];
	struct ibv_sge		tx_sges[MSGR_MAX_SGE];
	struct msgr_chunk	*tx_chunks[MSGR_MAX_SGE];
	uint64_t		tx_ring[MSGR_TX_QUEUE_LEN];	/* wr_ids in posting order */
	unsigned int		tx_head, tx_tail;
	int			closing;
};

/* infiniband.c */
int msgr_ib_open(struct msgr_ib *ib, const char *devname);
int msgr_pool_add_cluster(struct msgr_pool *p, unsigned int nchunks);
struct msgr_chunk *msgr_pool_get(struct msgr_pool *p);
void msgr_pool_put(struct msgr_pool *p, struct msgr_chunk *c);
void msgr_pool_destroy(struct msgr_pool *p);
int msgr_ib_create_qp(struct msgr_ib *ib, struct msgr_conn *conn);
int msgr_ib_post_beacon(struct msgr_conn *conn);

/* rdma_connection.c */
int msgr_conn_send(struct msgr_conn *conn, const struct iovec *iov, int iovcnt);
int msgr_conn_send_zc(struct msgr_conn *conn, const struct iovec *iov, int iovcnt);
void msgr_handle_tx_cqe(struct msgr_conn *conn, struct ibv_wc *wc);

#endif
