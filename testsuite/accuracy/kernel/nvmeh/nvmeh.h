/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvh: an NVMe-over-RDMA-style host split into queue setup (queue.c) and
 * the I/O path (io.c), written fresh for the accuracy corpus.
 */
#ifndef _NVMEH_H
#define _NVMEH_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/unaligned.h>
#include <linux/blk-mq.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define NVH_MAX_SEGMENTS	256

struct nvh_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
};

struct nvh_queue {
	struct nvh_device	*device;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	int			queue_size;
	int			cq_size;
	void			*ctrl;
};

struct nvh_request {
	struct nvh_queue	*queue;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct sg_table		sgt;
	int			nents;
	enum dma_data_direction	dir;
	atomic_t		ref;
	u8			sgl_key[4];
	u64			cmd_dma;
	u16			status;
};

struct nvh_ctrl {
	struct nvh_device	*device;
	struct nvh_queue	*queues;
	int			queue_count;
	int			sqsize;
};

void nvh_error_recovery(void *ctrl);
struct nvh_request *nvh_tag_to_req(struct nvh_queue *queue, u16 tag);

#endif /* _NVMEH_H */
