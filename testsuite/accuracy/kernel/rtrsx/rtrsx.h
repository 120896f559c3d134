/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rsx: an RTRS-server-style transport (drivers/infiniband/ulp/rtrs
 * rtrs-srv.c shape) split into path setup (srv_path.c) and the I/O path
 * (srv_io.c), written fresh for the accuracy corpus.
 */
#ifndef _RTRSX_H
#define _RTRSX_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define RSX_MAX_RECV_WR		4096
#define RSX_CHUNK_PAGES		32

struct rsx_path {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			queue_depth;
	u32			signal_interval;
	atomic_t		wr_cnt;
	struct sg_table		*chunk_sgt;
	struct ib_mr		**chunk_mrs;
	struct completion	reg_done;
	struct ib_cqe		reg_cqe;
	u64			info_rsp_dma;
};

struct rsx_info_rsp {
	__be16	sg_cnt;
	struct {
		__be64	addr;
		__be32	key;
		__be32	len;
	} desc[];
};

struct rsx_recv {
	struct ib_cqe		cqe;
	struct rsx_path		*path;
};

struct rsx_io {
	struct rsx_path		*path;
	struct ib_rdma_wr	data_wr;
	struct ib_send_wr	rsp_wr;
	struct ib_sge		data_sge;
	struct ib_sge		rsp_sge;
	struct ib_cqe		cqe;
	u32			msg_id;
	u32			client_rkey;
	bool			need_inval;
};

#endif /* _RTRSX_H */
