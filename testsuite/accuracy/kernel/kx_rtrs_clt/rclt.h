/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rclt.h - shared definitions of the rclt block transport client.
 *
 * rclt moves block I/O over one RDMA connection per path.  READs: the
 * client registers the request's own MR over the data pages and sends the
 * rkey in an RCLT_MSG_READ; the server RDMA-WRITEs the data, may
 * invalidate the rkey with SEND_WITH_INV, and completes the I/O with an
 * RDMA_WRITE_WITH_IMM carrying the message id.  WRITEs: the data is
 * registered with an MR taken from the connection's ready list
 * (rclt_mr.c); the server RDMA-READs it and answers with a SEND that may
 * invalidate that rkey.  A delayed work fails requests that the server
 * does not answer in time.
 *
 * Files: rclt_mr.c (MR pool, registration, invalidation, recovery) and
 * rclt_io.c (requests, completions, timeouts).
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this module
 */
#ifndef RCLT_H
#define RCLT_H

#include <linux/kernel.h>
#include <linux/types.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/wait.h>
#include <rdma/ib_verbs.h>

#define RCLT_MAX_SEGS		128
#define RCLT_IO_TIMEOUT_MS	30000
#define RCLT_MSG_NEED_INVAL_F	0x1

enum rclt_mr_state {
	RCLT_MR_READY,
	RCLT_MR_REGISTERED,
	RCLT_MR_INVALIDATED,
	RCLT_MR_ERROR,
};

struct rclt_con;

struct rclt_mr {
	struct list_head	list;		/* on con->mr_ready_list */
	struct list_head	all;		/* on con->mr_all */
	struct rclt_con		*con;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	enum rclt_mr_state	state;
	bool			need_invalidate;
	struct ib_reg_wr	wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	invalidate_done;
};

struct rclt_msg_desc {
	__le64	addr;
	__le32	key;
	__le32	len;
};

struct rclt_msg_io {
	__le32			type;
	__le32			msg_id;
	__le32			flags;
	__le32			sg_cnt;
	struct rclt_msg_desc	desc[1];
};

struct rclt_msg_rsp {
	__le32	type;
	__le32	msg_id;
	__le32	status;
};

struct rclt_rx {
	struct rclt_con		*con;
	struct rclt_msg_rsp	*buf;
	u64			dma;
	struct ib_cqe		cqe;
};

struct rclt_io_req {
	struct rclt_con		*con;
	u16			msg_id;
	bool			in_use;
	struct scatterlist	*sglist;
	unsigned int		sg_cnt;
	enum dma_data_direction	dir;
	struct ib_mr		*mr;		/* READ sink */
	struct rclt_mr		*wmr;		/* WRITE source, from the pool */
	bool			need_inv;
	bool			need_inv_comp;
	int			inv_errno;
	int			inv_status;
	struct ib_cqe		inv_cqe;
	struct completion	inv_comp;
	struct work_struct	done_work;
	int			status;
	unsigned long		start_jiffies;
	struct rclt_msg_io	*msg;
	u64			msg_dma;
	struct ib_sge		msg_sge;
	struct ib_cqe		send_cqe;
	void			*priv;
	void			(*conf)(void *priv, int err);
};

struct rclt_con {
	struct ib_qp		*qp;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	bool			connected;
	struct rclt_io_req	*reqs;
	int			queue_depth;
	u32			max_pages;
	struct ib_cqe		fast_reg_cqe;

	spinlock_t		mr_lock;
	struct list_head	mr_ready_list;
	struct list_head	mr_all;
	int			mr_cnt;
	wait_queue_head_t	wait_mr;
	struct work_struct	mr_recovery_work;

	struct delayed_work	timeout_dwork;
	struct work_struct	err_work;
};

/* rclt_mr.c */
int rclt_alloc_mrs(struct rclt_con *con);
void rclt_destroy_mrs(struct rclt_con *con);
struct rclt_mr *rclt_mr_register(struct rclt_con *con, struct scatterlist *sg,
				 int nents, bool writing);
int rclt_mr_deregister(struct rclt_mr *mr);
void rclt_mr_deregister_nowait(struct rclt_mr *mr);
void rclt_mr_recovery_work(struct work_struct *work);

/* rclt_io.c */
void rclt_con_error(struct rclt_con *con);

/* rclt_rx.c: receive ring */
int rclt_post_recv(struct rclt_con *con, struct rclt_rx *rx);

#endif /* RCLT_H */
