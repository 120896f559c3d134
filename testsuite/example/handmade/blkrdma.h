/*
 * blkrdma: a small block-storage protocol over RDMA, the bundled example ULP.
 *
 * The initiator exposes each I/O buffer to the target with an rkey carried
 * in the command; the target moves the data with RDMA READ/WRITE and answers
 * with SEND_WITH_INV so the initiator's rkey dies with the response. This
 * version manages memory registration by hand, the way many ULPs do, with
 * the bugs that come with it (see README.md); ../regcore is the same ULP on
 * the regcore API.
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

struct blk_target_io;

int blk_conn_create(struct blk_conn *conn, struct ibv_context *ctx,
		    unsigned int depth);
void blk_conn_destroy(struct blk_conn *conn);
void *blk_msg_slot(struct blk_conn *conn, unsigned int index);

int blk_submit(struct blk_request *req, enum blk_opcode op, uint64_t lba);
int blk_complete(struct blk_conn *conn, struct ibv_wc *wc,
		 struct blk_request *reqs);

int blk_target_setup(struct blk_target_io *io, struct blk_conn *conn);
int blk_target_execute(struct blk_target_io *io, const struct blk_cmd *cmd);
void blk_target_teardown(struct blk_target_io *io);

#endif
