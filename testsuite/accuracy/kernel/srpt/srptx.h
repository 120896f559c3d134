/* SPDX-License-Identifier: GPL-2.0 */
/*
 * srx: an SRP-target-style ULP (drivers/infiniband/ulp/srpt shape) split
 * into channel setup (srpt_ch.c) and the data path (srpt_io.c), written
 * fresh for the accuracy corpus.
 */
#ifndef _SRPTX_H
#define _SRPTX_H

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rw.h>

struct srx_recv_ioctx {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	u64			dma;
	struct srx_rdma_ch	*ch;
};

struct srx_rdma_ch {
	struct srx_recv_ioctx	*recv_ring;
	u32			cq_size;
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			rq_size;
	u32			max_rsp_size;
	u32			port_num;
};

struct srx_rw_ctx {
	struct rdma_rw_ctx	rw;
	struct scatterlist	*sg;
	unsigned int		nents;
};

struct srx_send_ioctx {
	struct srx_rdma_ch	*ch;
	struct srx_rw_ctx	*rw_ctxs;
	unsigned int		n_rw_ctx;
	enum dma_data_direction	dir;
	struct ib_cqe		rdma_cqe;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		sge;
	u64			rsp_dma;
	u32			rsp_len;
};

struct srx_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

void srx_put_send_ioctx(struct srx_send_ioctx *ioctx);
void srx_handle_new_iu(struct srx_rdma_ch *ch, struct srx_recv_ioctx *r, u32 len);
void srx_handle_write_data(struct srx_send_ioctx *ioctx);

#endif /* _SRPTX_H */
