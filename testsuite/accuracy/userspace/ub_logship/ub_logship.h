/*
 * ub_logship.h - RDMA write-ahead-log shipping between a primary and its
 * replicas (rdma_cm, RC).
 *
 * The replica owns a log ring per connection, registered for remote write
 * (rdma_reg_write) and announced in the accept private data.  The primary
 * RDMA-WRITEs each batch of records into the ring and chains a COMMIT SEND
 * behind it; the replica applies the batch and returns credits with an ACK.
 * The primary exposes its own log for remote read (rdma_reg_read) so that a
 * replica that sees a gap can pull the manifest and the missing range.
 *
 * ub_ls_conn.c: event loop, connection setup/teardown, QP sizing (the
 *               daemon creates the primary's cm_id, a zeroed ls_conn as
 *               its context, and resolves the replica's address)
 * ub_ls_io.c:   shipping, commits, acks, catch-up reads, completions
 * ub_ls_ring.c: replica log rings and the ring cache
 */
#ifndef UB_LOGSHIP_H
#define UB_LOGSHIP_H

#include <stdint.h>
#include <stddef.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define LS_RING_SIZE	(64u << 20)
#define LS_CREDITS	64		/* COMMIT messages in flight per connection */
#define LS_RECV_DEPTH	4096
#define LS_MAX_SGE	4
#define LS_INLINE	128
#define LS_SIG_EVERY	32
#define LS_STAGE_SIZE	(1u << 20)
#define LS_MANIFEST_MAX	256

enum ls_role { LS_PRIMARY, LS_REPLICA };
enum ls_msg_type { LS_COMMIT = 1, LS_ACK };

struct ls_msg {
	uint32_t type;
	uint32_t len;
	uint64_t lsn;
	uint64_t ring_off;
	uint32_t credits;
	uint32_t pad;
};

/* accept/connect private data */
struct ls_pdata {
	uint64_t addr;
	uint32_t rkey;
	uint32_t size;
	uint32_t credits;
};

struct ls_manifest {
	uint64_t first_lsn, last_lsn;
	uint64_t seg_off[LS_MANIFEST_MAX];
};

struct ls_ring {
	struct ls_ring *next;
	void *base;
	size_t size;
	struct ibv_mr *mr;
};

struct ls_record {
	uint64_t lsn;
	const void *data;
	uint32_t len;
};

/* one shipped batch: RDMA WRITE into the replica ring, then COMMIT */
struct ls_batch {
	struct ibv_send_wr write_wr, commit_wr;
	struct ibv_sge write_sge, commit_sge;
	struct ibv_mr *big_mr;		/* oversized record registered for this batch */
	int busy;
};

struct ls_conn {
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	enum ls_role role;
	uint32_t credits;		/* COMMITs the peer can still receive */
	uint32_t unsig;			/* COMMITs since the last signaled one */
	uint32_t acks_unsig;		/* ACKs since the last signaled one */
	uint32_t max_inline;

	struct ls_msg *recv_msgs, *send_msgs;
	struct ibv_mr *recv_mr, *send_mr;
	struct ls_manifest *manifest;
	struct ibv_mr *manifest_mr;

	struct ls_ring *ring;		/* replica: our ring */
	struct ibv_mr *plog_mr;		/* primary: our log, readable by replicas */
	uint64_t remote_addr;		/* primary: replica ring; replica: primary log */
	uint32_t remote_rkey, remote_size;
	uint64_t ring_tail, next_lsn;

	void *stage;
	struct ibv_mr *stage_mr;
	struct ls_batch batches[LS_CREDITS];
	void (*apply)(const void *data, size_t len);
};

/* primary log (owned by the WAL writer) and the replica's applier */
extern void *ls_log_base;
extern size_t ls_log_size;
void ls_apply(const void *data, size_t len);

/* ub_ls_ring.c */
int ls_ring_get(struct rdma_cm_id *id, struct ls_ring **out);
void ls_ring_put(struct ls_ring *r);
void ls_ring_cache_drain(void);

/* ub_ls_conn.c */
int ls_create_qp(struct ls_conn *c);
void ls_conn_teardown(struct ls_conn *c);
int ls_event_loop(struct rdma_event_channel *ec, enum ls_role role);

/* ub_ls_io.c */
int ls_post_recv(struct ls_conn *c, int i);
int ls_ship(struct ls_conn *c, const struct ls_record *recs, int n);
int ls_process_cq(struct ls_conn *c);

#endif
