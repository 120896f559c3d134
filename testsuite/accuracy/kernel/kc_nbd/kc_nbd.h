// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kc_nbd.h - kc_nbd, a network block device over RDMA.  kc_nbd_conn.c: queue
 * setup/teardown (PD, QP, one MR per request, receive ring); kc_nbd_io.c:
 * REG_MR + command SEND per request; kc_nbd_cq.c: completions (SEND_WITH_INV
 * or our own LOCAL_INV before a request is recycled), timeouts, MR recovery.
 */
#ifndef KC_NBD_H
#define KC_NBD_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/workqueue.h>
#include <linux/blk-mq.h>
#include <rdma/rdma_cm.h>

#define KC_NBD_MAX_PAGES	64
#define KC_NBD_WRS_PER_REQ	3	/* REG_MR + SEND + LOCAL_INV */
#define KC_NBD_SIGNAL_EVERY	16
#define KC_NBD_INLINE_SIZE	256
#define KC_NBD_REQ_OP_DRV_IN	34	/* zone report, driver private op */

enum kc_nbd_kind { KC_NBD_CMD_READ, KC_NBD_CMD_WRITE, KC_NBD_CMD_REPORT };

struct kc_nbd_wire_cmd {
	u8	opcode, flags;
	u16	tag;
	__le64	offset, addr;
	__le32	len, rkey;
};

struct kc_nbd_req {
	struct kc_nbd_queue	*q;
	struct list_head	list;		/* on q->free_list while idle */
	struct request		*rq;
	u16			tag;
	enum kc_nbd_kind	kind;
	struct ib_mr		*mr;
	struct scatterlist	sgl[KC_NBD_MAX_PAGES];
	int			nents;
	enum dma_data_direction	dir;
	struct kc_nbd_wire_cmd	*cmd;		/* DMA-mapped at cmd_dma */
	u64			cmd_dma;
	struct ib_sge		sge;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr, inv_wr;
	struct ib_cqe		reg_cqe, send_cqe, inv_cqe;
};

struct kc_nbd_rx {
	struct ib_cqe		cqe;
	struct kc_nbd_queue	*q;
	struct { u16 tag, status; } *rsp;	/* response capsule */
	u64			dma;
};

struct kc_nbd_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	struct request_queue	*blkq;
	u32			depth, max_inline;
	bool			fast_small_reads;
	struct kc_nbd_req	*reqs;
	struct kc_nbd_rx	*rx;
	spinlock_t		lock;
	struct list_head	free_list;
	atomic_t		since_signal;
	struct work_struct	err_work;
};

int kc_nbd_post_recv(struct kc_nbd_queue *q, struct kc_nbd_rx *rx);
int kc_nbd_create_queue(struct kc_nbd_queue *q);			/* conn */
void kc_nbd_destroy_queue(struct kc_nbd_queue *q);
void kc_nbd_put_req(struct kc_nbd_queue *q, struct kc_nbd_req *req);	/* io */
blk_status_t kc_nbd_queue_rq(struct kc_nbd_queue *q, struct request *rq);
void kc_nbd_reg_done(struct ib_cq *cq, struct ib_wc *wc);		/* cq */
void kc_nbd_send_done(struct ib_cq *cq, struct ib_wc *wc);
void kc_nbd_recv_done(struct ib_cq *cq, struct ib_wc *wc);
enum blk_eh_timer_return kc_nbd_timeout(struct kc_nbd_req *req);

#endif /* KC_NBD_H */
