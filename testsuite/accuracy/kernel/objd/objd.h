/* SPDX-License-Identifier: GPL-2.0 */
/*
 * objd: the target of an invented object store, split into connection setup
 * (objd_conn.c) and data movement (objd_rw.c), written fresh for the
 * accuracy corpus.
 */
#ifndef _OBJD_H
#define _OBJD_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

#define OBJD_MAX_SEND_SGE	8
#define OBJD_MAX_PAGES		256
#define OBJD_META_SIZE		256

struct objd_conn;

struct objd_recv {
	struct objd_conn	*conn;
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	u64			dma;
};

struct objd_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			depth;
	u32			cq_size;
	struct objd_recv	*recvs;
};

void objd_handle_cmd(struct objd_conn *conn, struct objd_recv *r, u32 len);

struct objd_cmd {
	struct objd_conn	*conn;
	struct rdma_rw_ctx	rw;
	struct ib_cqe		rw_cqe;
	struct ib_cqe		meta_cqe;
	struct ib_cqe		rsp_cqe;
	struct ib_rdma_wr	meta_wr;
	struct ib_sge		meta_sge;
	struct ib_send_wr	rsp_wr;
	struct ib_sge		rsp_sge;
	struct scatterlist	*sgl;
	u32			nents;
	enum dma_data_direction	dir;
	u64			meta_dma;
	u64			rsp_dma;
};

void objd_store_object(struct objd_cmd *cmd);
void objd_free_cmd(struct objd_cmd *cmd);

#endif /* _OBJD_H */
