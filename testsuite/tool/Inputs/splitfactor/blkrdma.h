/*
 * An initiator split over two files, like most ULPs: conn.c sizes the send
 * queue with a hand-made factor, initiator.c posts the LOCAL_INV that the
 * factor is for. Only the whole compile database connects the two.
 */
#ifndef BLKRDMA_H
#define BLKRDMA_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stddef.h>

#define BLK_QUEUE_DEPTH 32
#define BLK_MAX_IO (128 * 1024)
#define BLK_MSG_SIZE 64

enum blk_opcode { BLK_CMD_READ = 1, BLK_CMD_WRITE = 2 };

/* On the wire, big endian. */
struct blk_cmd {
	uint8_t opcode;
	uint8_t rsvd[3];
	uint32_t tag;
	uint64_t lba;
	uint64_t addr;   /* initiator buffer */
	uint32_t rkey;   /* initiator buffer's rkey */
	uint32_t length;
};

struct blk_rsp {
	uint32_t tag;
	int32_t status;
};

struct blk_conn {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *msgs;               /* send and receive message slots */
	struct ibv_mr *msg_mr;
	unsigned int depth;
};

struct blk_request {
	struct blk_conn *conn;
	uint32_t tag;
	void *buf;
	size_t len;
	struct ibv_mr *mr;        /* registered per I/O, rkey sent to target */
	struct ibv_send_wr send_wr;
	struct ibv_send_wr inv_wr;
	struct ibv_sge send_sge;
	int done;
	int status;
};


int blk_conn_create(struct blk_conn *conn, struct ibv_context *ctx,
		    unsigned int depth);
void blk_conn_destroy(struct blk_conn *conn);
void *blk_msg_slot(struct blk_conn *conn, unsigned int index);

int blk_submit(struct blk_request *req, enum blk_opcode op, uint64_t lba);
int blk_complete(struct blk_conn *conn, struct ibv_wc *wc,
		 struct blk_request *reqs);

#endif
