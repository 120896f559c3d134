/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kvx.h - shared definitions of the KVX key-value server.
 */
#ifndef _KVX_H
#define _KVX_H

#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/completion.h>
#include <linux/atomic.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define KVX_MAX_REQS		256
#define KVX_MAX_SGE		16
#define KVX_INLINE		64
#define KVX_MAX_VALUE_PAGES	64
#define KVX_INDEX_MAX_PAGES	512
#define KVX_CTRL_WRS		4
#define KVX_NOTIFY_SIG_EVERY	16

struct kvx_accept_msg {
	__le32	version;
	__le32	index_rkey;
	__le64	index_addr;
	__le32	index_len;
};

struct kvx_index {
	struct ib_mr		*mr;
	struct sg_table		sgt;
	int			nents;
	u32			npages;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	done;
	int			status;
	struct mutex		lock;
};

struct kvx_server {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			port_num;
	struct kvx_index	index;
};

struct kvx_conn {
	struct kvx_server	*srv;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			port_num;
};

struct kvx_req {
	struct kvx_conn		*conn;
	atomic_t		ref;
	struct rdma_rw_ctx	rw;
	bool			rw_live;
	struct scatterlist	*sg;
	u32			sg_cnt;
	enum dma_data_direction	dir;
	u64			remote_addr;
	u32			remote_key;
	struct ib_cqe		rw_cqe, rsp_cqe;
	struct ib_send_wr	rsp_wr;
	struct ib_sge		rsp_sge;
	void			(*release)(struct kvx_req *req);
};

/* kvx_main.c */
int kvx_conn_create(struct kvx_conn *conn);
void kvx_build_accept(struct kvx_conn *conn, struct kvx_accept_msg *msg);
void kvx_req_put(struct kvx_req *req);

/* kvx_rw.c */
int kvx_get_value(struct kvx_req *req, u64 rsp_dma, u32 rsp_len);
int kvx_put_value(struct kvx_req *req);

/* kvx_index.c */
int kvx_index_init(struct kvx_server *srv, struct kvx_conn *conn);
int kvx_index_resize(struct kvx_server *srv, struct kvx_conn *conn,
		     struct sg_table *new_sgt, u32 npages);
void kvx_index_exit(struct kvx_server *srv);
int kvx_notify_index_change(struct kvx_conn *conn, void *msg, u32 len);

#endif /* _KVX_H */
