/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nbdx: an invented network block device over RDMA, split into setup
 * (nbdx_main.c), submission (nbdx_io.c) and completion handling
 * (nbdx_cq.c), written fresh for the accuracy corpus.
 */
#ifndef _NBDX_H
#define _NBDX_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/unaligned.h>
#include <linux/blk-mq.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define NBDX_QUEUE_DEPTH	128
#define NBDX_MAX_PAGES		64
#define NBDX_NR_MRS		(NBDX_QUEUE_DEPTH / 2)	/* to save memory */

struct nbdx_mr {
	struct list_head	entry;
	struct ib_mr		*mr;
	bool			overflow;	/* allocated on demand */
};

struct nbdx_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	spinlock_t		lock;
	struct list_head	free_mrs;
	struct nbdx_mr		*mrs;
};

struct nbdx_req {
	struct nbdx_queue	*q;
	struct nbdx_mr		*nmr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct scatterlist	*sgl;
	int			nents;
	u8			*cmd;
	u64			cmd_dma;
	blk_status_t		status;
};

struct nbdx_rsp {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	struct nbdx_queue	*q;
	__be32			*buf;
	u64			dma;
};

struct nbdx_req *nbdx_tag_to_req(struct nbdx_queue *q, u32 tag);

/* nbdx_io.c */
void nbdx_put_mr(struct nbdx_queue *q, struct nbdx_mr *nmr);
int nbdx_queue_rq(struct nbdx_req *req);

#endif /* _NBDX_H */
