/*
 * blkc - a multi-threaded block storage client over RDMA.
 *
 * One connection owns a slab of I/O slots registered once, a type-2 memory
 * window per request, and a request free list shared by the submitting
 * threads, the completion poller and a timeout reaper thread.
 *
 * Reads: the request's window is bound over its slot (or, for reads larger
 * than a slot, the user buffer is registered for this I/O) and the key goes
 * to the server inside the command. The server RDMA WRITEs the data and
 * answers with SEND_WITH_INV on the window's key; the client checks the
 * invalidated key and posts its own LOCAL_INV otherwise. Small writes push
 * the data from the slot with RDMA WRITE into the server's staging area.
 *
 * blkc_conn.c: setup and teardown. blkc_io.c: submission, completions,
 * timeouts, drain.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-registration-in-datapath, rdma-queue-cap-unchecked, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation -- not reviewed for this program
 */
#ifndef BLKC_H
#define BLKC_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define BLKC_QUEUE_DEPTH     64
#define BLKC_SLOT_SIZE       (256u * 1024)
#define BLKC_RX_MSG_SIZE     64
#define BLKC_IO_TIMEOUT_MS   5000

#define BLKC_WRID_INV        0x1ull
#define BLKC_WRID_DRAIN      0x2ull
#define BLKC_WRID_MASK       0x3ull

#define blkc_log(fmt, ...) fprintf(stderr, "blkc: " fmt "\n", ##__VA_ARGS__)

enum blkc_op {
	BLKC_OP_READ  = 1,
	BLKC_OP_WRITE = 2,
};

enum blkc_req_state {
	BLKC_REQ_FREE,
	BLKC_REQ_INFLIGHT,
	BLKC_REQ_INVALIDATING,
	BLKC_REQ_TIMEDOUT,
};

/* wire format */
struct blkc_cmd {
	uint64_t tag;
	uint64_t lba;
	uint32_t len;
	uint8_t  op;
	uint8_t  flags;
	uint16_t rsvd;
	uint64_t addr;
	uint32_t rkey;
	uint32_t pad;
} __attribute__((packed));

struct blkc_rsp {
	uint64_t tag;
	int32_t  status;
	uint32_t pad;
} __attribute__((packed));

typedef void (*blkc_done_fn)(void *arg, int status);

struct blkc_conn;

struct blkc_req {
	struct blkc_req    *next;
	struct blkc_conn   *conn;
	int                 state;
	int                 op;
	struct ibv_mw      *mw;
	uint32_t            rkey;
	void               *slot;
	void               *user_buf;
	struct ibv_mr      *big_mr;
	uint32_t            len;
	uint64_t            deadline_ms;
	struct blkc_cmd    *cmd;
	struct ibv_sge      cmd_sge;
	struct ibv_sge      data_sge;
	struct ibv_send_wr  bind_wr;
	struct ibv_send_wr  data_wr;
	struct ibv_send_wr  cmd_wr;
	struct ibv_send_wr  inv_wr;
	blkc_done_fn        done;
	void               *done_arg;
};

struct blkc_conn {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	pthread_mutex_t     lock;
	pthread_t           reaper;
	volatile int        stopping;

	void               *slab;
	struct ibv_mr      *slab_mr;
	void               *cmd_ring;
	struct ibv_mr      *cmd_mr;
	void               *rx_ring;
	struct ibv_mr      *rx_mr;

	struct blkc_req     reqs[BLKC_QUEUE_DEPTH];
	struct blkc_req    *free_list;

	uint64_t            srv_stage_addr;
	uint32_t            srv_stage_rkey;
};

/* blkc_conn.c */
uint64_t blkc_now_ms(void);
int  blkc_conn_setup(struct blkc_conn *c, struct ibv_context *ctx);
void blkc_conn_destroy(struct blkc_conn *c);

/* blkc_io.c */
struct blkc_req *blkc_req_get(struct blkc_conn *c);
void blkc_req_put(struct blkc_conn *c, struct blkc_req *req);
int  blkc_submit_read(struct blkc_conn *c, uint64_t lba, void *buf, uint32_t len,
		      blkc_done_fn done, void *arg);
int  blkc_write_small(struct blkc_conn *c, uint64_t lba, const void *data,
		      uint32_t len, blkc_done_fn done, void *arg);
void blkc_poll(struct blkc_conn *c);
void *blkc_reaper_main(void *arg);
int  blkc_drain(struct blkc_conn *c);

#endif /* BLKC_H */
