/*
 * blkc - block storage client over RDMA (shared definitions).
 *
 * One admin queue and up to BLKC_MAX_QUEUES I/O queues, each an RC QP on
 * its own rdma_cm id.  Data is never copied: for every command with data
 * the client binds a type-2 memory window over the buffer (BIND_MW),
 * sends the command carrying the window's rkey (SEND), and kills the
 * window when the response arrives - by the target's SEND_WITH_INV or by
 * a LOCAL_INV of its own.  Buffers from blkc_buf_alloc() come from a
 * pool registered at setup; other buffers are registered per command.
 *
 *   blkc_queue.c  controller setup, I/O queue creation and teardown
 *   blkc_io.c     I/O submission and completion
 *   blkc_admin.c  admin queue: identify, keep-alive
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-rkey-reuse, rdma-unmap-before-invalidate, rdma-local-mr-management, rdma-send-queue-manual-factor -- not reviewed for this program
 */
#ifndef BLKC_H
#define BLKC_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define BLKC_MAX_QUEUES		16
#define BLKC_MAX_QUEUE_DEPTH	2048
#define BLKC_AQ_DEPTH		32
#define BLKC_AQ_INLINE		128
#define BLKC_ID_BUF_SZ		4096
#define BLKC_POOL_SZ		(64UL << 20)

enum blkc_opcode {
	BLKC_CMD_FLUSH		= 0x00,
	BLKC_CMD_WRITE		= 0x01,
	BLKC_CMD_READ		= 0x02,
	BLKC_ADM_IDENTIFY	= 0x06,
	BLKC_ADM_KEEP_ALIVE	= 0x18,
};

/* 64 bytes on the wire */
struct blkc_cmd {
	uint8_t		opcode;
	uint8_t		flags;
	uint16_t	tag;
	uint32_t	nsid;
	uint64_t	slba;
	uint64_t	addr;
	uint32_t	len;
	uint32_t	rkey;
	uint32_t	nlb;
	uint8_t		rsvd[28];
};

struct blkc_rsp {
	uint16_t	tag;
	uint16_t	status;
	uint32_t	result;
	uint64_t	rsvd;
};

struct blkc_queue;

struct blkc_req {
	struct blkc_queue	*q;
	uint16_t		 tag;
	struct ibv_mw		*mw;
	uint32_t		 rkey;
	bool			 mapped;
	int			 pending;	/* send, response, local inv */
	struct ibv_mr		*user_mr;	/* buffer outside the pool */
	void			*data;
	size_t			 len;
	uint8_t			 opcode;
	int			 status;
	struct ibv_send_wr	 bind_wr;
	struct ibv_send_wr	 send_wr;
	struct ibv_send_wr	 inv_wr;
	struct ibv_sge		 send_sge;
	void			(*done)(struct blkc_req *req, int status);
	void			*priv;
	struct blkc_req		*next_free;
};

struct blkc_queue {
	struct blkc_ctrl	*ctrl;
	int			 qid;
	struct rdma_cm_id	*cm_id;
	struct ibv_qp		*qp;
	struct ibv_cq		*cq;
	unsigned		 depth;
	struct blkc_req		*reqs;
	struct blkc_req		*free_reqs;
	struct blkc_cmd		*cmds;
	struct ibv_mr		*cmd_mr;
	struct blkc_rsp		*rsps;
	struct ibv_mr		*rsp_mr;
	unsigned		 nr_rsps;
};

struct blkc_areq {
	struct ibv_mw		*mw;
	uint32_t		 rkey;
	bool			 mapped;
	bool			 busy;
	bool			 done;
	int			 status;
	struct ibv_send_wr	 bind_wr;
	struct ibv_send_wr	 send_wr;
	struct ibv_send_wr	 inv_wr;
	struct ibv_sge		 sge;
	struct blkc_cmd		 cmd;
};

struct blkc_aq {
	struct rdma_cm_id	*cm_id;
	struct ibv_qp		*qp;
	struct ibv_cq		*cq;
	unsigned		 inline_max;
	struct blkc_areq	 reqs[BLKC_AQ_DEPTH];
	struct blkc_rsp		 rsps[BLKC_AQ_DEPTH];
	struct ibv_mr		*rsp_mr;
	char			*id_buf;
	struct ibv_mr		*id_mr;
};

struct blkc_opts {
	unsigned	nr_io_queues;
	unsigned	queue_depth;
};

struct blkc_ctrl {
	struct blkc_opts	 opts;
	struct ibv_context	*verbs;
	struct ibv_device_attr	 dev_attr;
	struct ibv_pd		*pd;
	char			*pool;
	struct ibv_mr		*pool_mr;
	struct blkc_queue	 queues[BLKC_MAX_QUEUES];
	struct blkc_aq		 aq;
};

int blkc_ctrl_setup(struct blkc_ctrl *ctrl, struct rdma_cm_id *aq_id,
		    struct rdma_cm_id **io_ids);
int blkc_queue_create(struct blkc_ctrl *ctrl, struct blkc_queue *q,
		      struct rdma_cm_id *id, unsigned depth);
void blkc_queue_destroy(struct blkc_queue *q);
int blkc_post_rsp(struct blkc_queue *q, unsigned i);

int blkc_submit(struct blkc_queue *q, uint8_t opcode, uint64_t slba, void *buf,
		size_t len, void (*done)(struct blkc_req *, int), void *priv);
int blkc_poll(struct blkc_queue *q);

int blkc_aq_create(struct blkc_ctrl *ctrl, struct rdma_cm_id *id);
int blkc_identify(struct blkc_ctrl *ctrl, void *out, size_t len);
int blkc_keep_alive(struct blkc_ctrl *ctrl);

#endif /* BLKC_H */
