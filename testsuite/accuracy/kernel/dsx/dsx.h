/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dsx.h - shared definitions of the DSX object storage client transport.
 */
#ifndef _DSX_H
#define _DSX_H

#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define DSX_MAX_SGE		6
#define DSX_RECV_DEPTH		2048
#define DSX_MAX_PAGES		64
#define DSX_TIMEOUT_MS		30000

enum dsx_op { DSX_OP_READ, DSX_OP_WRITE, DSX_OP_LIST, DSX_OP_STAT };

struct dsx_wire_req {
	__le64	tag;
	__le64	addr;
	__le32	rkey;
	__le32	length;
	u8	op;
};

struct dsx_wire_rsp {
	__le64	tag;
	__le32	status;
};

struct dsx_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			depth;
	u32			max_pages;
	spinlock_t		lock;
	struct list_head	inflight;
	struct delayed_work	timeout_work;
};

struct dsx_req {
	struct dsx_conn		*conn;
	struct list_head	entry;
	enum dsx_op		op;
	unsigned long		deadline;
	struct ib_mr		*mr;
	struct scatterlist	*sg;
	int			nents;
	enum dma_data_direction	dir;
	struct ib_cqe		reg_cqe, send_cqe, inv_cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr, inv_wr;
	struct ib_sge		send_sge;
	struct dsx_wire_req	*wire;
	u64			wire_dma;
	int			wc_flags;
	u32			inv_rkey;
	int			status;
	void			(*done)(struct dsx_req *req, int status);
};

/* dsx_conn.c */
int dsx_conn_setup(struct dsx_conn *conn);
void dsx_conn_teardown(struct dsx_conn *conn);

/* dsx_io.c */
int dsx_submit(struct dsx_req *req);
void dsx_io_release(struct dsx_req *req);
int dsx_io_invalidate(struct dsx_req *req);
void dsx_req_complete(struct dsx_req *req, int status);
void dsx_abort(struct dsx_req *req);

/* dsx_recv.c */
void dsx_recv_done(struct ib_cq *cq, struct ib_wc *wc);

#endif /* _DSX_H */
