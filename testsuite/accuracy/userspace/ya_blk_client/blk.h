/*
 * ya_blk_client - a userspace block-storage initiator speaking an
 * NVMe-oF-like capsule protocol over one RC queue pair.
 *
 *   blk.h        shared definitions, tag allocator
 *   blk_queue.c  queue setup, reconnect reset and teardown
 *   blk_io.c     submission, response handling, timeouts
 *
 * Every I/O registers its data buffer (or an aligned bounce copy of it) in
 * the queue's per-slot MR array, q->data_mr[tag], with the remote right the
 * target needs (REMOTE_READ for writes, REMOTE_WRITE for reads), and puts
 * {addr, len, rkey} into the command capsule's keyed SGL.  Small writes go
 * in-capsule and register nothing.  The response completes the I/O; the MR
 * must be deregistered before the slot and the bounce copy are handed back.
 * The sense buffer (target-written error log) is registered once with
 * REMOTE_WRITE and its key sent in the connect private data.
 * The initiator never offers remote invalidation: a response that carries one
 * is a protocol error.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-mr-leak, rdma-queue-cap-unchecked, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed in this program
 */
#ifndef YA_BLK_H
#define YA_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <infiniband/verbs.h>

#define BLK_MAX_DEPTH        128
#define BLK_INCAPSULE_MAX    4096
#define BLK_IO_TIMEOUT_SEC   30
#define BLK_ABORT_TIMEOUT_SEC 5
#define BLK_SENSE_SIZE       4096

enum blk_opc { BLK_OPC_READ = 0x02, BLK_OPC_WRITE = 0x01, BLK_OPC_ABORT = 0x08 };

enum blk_sc {
	BLK_SC_SUCCESS       = 0x00,
	BLK_SC_INVALID_FIELD = 0x02,
	BLK_SC_ABORTED       = 0x07,
	BLK_SC_MEDIA_ERROR   = 0x81,
};

#define BLK_CMD_F_INCAPSULE  0x1

struct blk_keyed_sgl {
	uint64_t addr;
	uint32_t len;
	uint32_t key;
};

struct blk_capsule {
	uint8_t  opcode;
	uint8_t  flags;
	uint16_t tag;
	uint32_t nlb;
	uint64_t slba;
	struct blk_keyed_sgl sgl;
	uint8_t  data[BLK_INCAPSULE_MAX];
};

struct blk_rsp {
	uint16_t tag;
	uint16_t status;
	uint32_t rsvd;
};

struct blk_io {
	void    *buf;
	size_t   len;
	uint64_t slba;
	bool     write;
	void   (*done)(struct blk_io *io, int err);
	void    *priv;
};

struct blk_queue {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	unsigned            depth;

	bool                slot_busy[BLK_MAX_DEPTH];
	bool                aborting[BLK_MAX_DEPTH];
	time_t              deadline[BLK_MAX_DEPTH];
	struct blk_io      *io[BLK_MAX_DEPTH];
	struct ibv_mr      *data_mr[BLK_MAX_DEPTH];
	void               *bounce[BLK_MAX_DEPTH];

	struct blk_capsule *cmds;
	struct ibv_mr      *cmd_mr;
	struct blk_rsp     *rsps;
	struct ibv_mr      *rsp_mr;

	void               *sense_buf;
	struct ibv_mr      *sense_mr;
};

static inline int blk_alloc_tag(struct blk_queue *q)
{
	unsigned i;

	for (i = 0; i < q->depth; i++) {
		if (!q->slot_busy[i]) {
			q->slot_busy[i] = true;
			q->aborting[i] = false;
			return (int)i;
		}
	}
	return -1;
}

static inline void blk_free_tag(struct blk_queue *q, unsigned tag)
{
	q->io[tag] = NULL;
	q->slot_busy[tag] = false;
}

/* blk_queue.c */
struct blk_queue *blk_queue_create(struct ibv_context *ctx, unsigned depth,
				   struct blk_keyed_sgl *sense_out);
void blk_queue_reset(struct blk_queue *q);
void blk_queue_destroy(struct blk_queue *q);
int blk_post_rsp_recv(struct blk_queue *q, unsigned idx);

/* blk_io.c */
int blk_submit(struct blk_queue *q, struct blk_io *io);
int blk_process_completions(struct blk_queue *q);
void blk_check_timeouts(struct blk_queue *q);

#endif
