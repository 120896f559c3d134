/*
 * blkrdma: a small block-storage protocol over RDMA, the bundled example ULP.
 *
 * The initiator exposes each I/O buffer to the target with an rkey carried
 * in the command; the target moves the data with RDMA READ/WRITE through a
 * bounce buffer and answers with a response message. This version manages
 * memory registration by hand, the way many ULPs do, with the bugs that come
 * with it (see ../README.md); ../regcore is the same ULP on the regcore API.
 * Both versions share this interface (apart from the private struct fields)
 * and the wire format, so ../run/blkdemo.c drives either one on simverbs.
 */
#ifndef BLKRDMA_H
#define BLKRDMA_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stddef.h>

#define BLK_QUEUE_DEPTH 32
#define BLK_MAX_IO (128 * 1024)
#define BLK_MSG_SIZE 64
#define BLK_SECTOR 512
#define BLK_DISK_SIZE (4 * 1024 * 1024)

enum blk_opcode { BLK_CMD_READ = 1, BLK_CMD_WRITE = 2 };

/* Command flags. */
enum { BLK_F_INVALIDATE = 1 }; /* answer with SEND_WITH_INV of rkey */

/* On the wire, big endian. */
struct blk_cmd {
	uint8_t opcode;
	uint8_t flags;
	uint8_t rsvd[2];
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

/* Message slots: [0, depth) send, [depth, 2 * depth) receive. */
struct blk_conn {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *msgs;
	struct ibv_mr *msg_mr;
	unsigned int depth;
	struct ibv_recv_wr recv_wr;
	struct ibv_sge recv_sge;
};

struct blk_request {
	struct blk_conn *conn;
	uint32_t tag;
	void *buf;
	size_t len;
	uint32_t rkey;            /* the key advertised in the last command */
	struct ibv_mr *mr;        /* registered per I/O, rkey sent to target */
	struct ibv_send_wr send_wr;
	struct ibv_sge send_sge;
	int done;
	int status;
};

struct blk_target_io;

/* conn.c */
int blk_conn_create(struct blk_conn *conn, struct ibv_context *ctx,
		    unsigned int depth);
void blk_conn_destroy(struct blk_conn *conn);
void *blk_msg_slot(struct blk_conn *conn, unsigned int index);
int blk_conn_post_recv(struct blk_conn *conn, unsigned int slot);
int blk_conn_poll(struct blk_conn *conn, struct ibv_wc *wc, int n);

/* initiator.c: requests are set up by the caller (conn, tag, buf, len). */
int blk_submit(struct blk_request *req, enum blk_opcode op, uint64_t lba);
int blk_initiator_handle(struct blk_conn *conn, struct ibv_wc *wc,
			 struct blk_request *reqs);

/* target.c: one I/O at a time, served from an in-memory disk. */
struct blk_target_io *blk_target_create(struct blk_conn *conn);
void blk_target_destroy(struct blk_target_io *io);
int blk_target_handle(struct blk_target_io *io, struct ibv_wc *wc);

#endif
