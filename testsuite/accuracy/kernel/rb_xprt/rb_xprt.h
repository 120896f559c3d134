/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/*
 * rb_xprt.h - shared definitions of the rbx RPC-over-RDMA client transport.
 *
 * An xprtrdma-style NFS client transport split over two files:
 *   rb_frwr.c   FRWR memory registration: MR allocation, chunk registration,
 *               remote and local invalidation, LOCAL_INV completions;
 *   rb_verbs.c  endpoint/QP setup, Send/Receive, the reply handler, RPC
 *               release/abort and the reset that runs after a disconnect.
 *
 * Every transport keeps all its MRs on rx_mrs_all and the idle ones on
 * rx_mrs_free.  Marshaling takes MRs from the free list, registers the RPC's
 * chunks and links them on req->rl_registered; the REG_MR WRs are chained in
 * front of the RPC Call's Send.  The server may invalidate one handle with
 * SEND_WITH_INV; the others are invalidated locally before the RPC completes.
 * The PD is created once per transport and survives reconnects, so a handle
 * that was never invalidated still works on the next connection; after a
 * disconnect the MRs still attached to requests are deregistered instead of
 * recycled.
 *
 * Known problems: the abort path recycles registered MRs without invalidating
 * them, the RDMA_ERROR reply path trusts a remote invalidation without looking
 * at which handle was invalidated, the async LOCAL_INV completion releases the
 * MR without checking the status, and MR setup leaks the ib_mr when the
 * scatterlist cannot be allocated.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-rkey-reuse,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad -- not reviewed in this module
 */
#ifndef RB_XPRT_H
#define RB_XPRT_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RBX_MAX_DEPTH		64	/* pages per MR */
#define RBX_MAX_SEGS		8	/* MRs per RPC */
#define RBX_INLINE_SIZE		1024

struct rbx_xprt;
struct rbx_req;

struct rbx_mr_seg {
	struct page	*mr_page;
	u32		mr_len;
	u32		mr_offset;
};

struct rbx_mr {
	struct list_head	mr_list;	/* rx_mrs_free or rl_registered */
	struct list_head	mr_all;		/* rx_mrs_all */
	struct rbx_xprt		*mr_xprt;
	struct rbx_req		*mr_req;
	struct ib_mr		*ibmr;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct ib_cqe		mr_cqe;
	struct completion	mr_linv_done;
	bool			mr_linv_failed;
};

struct rbx_rep {
	struct ib_cqe		rr_cqe;
	struct rbx_xprt		*rr_xprt;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
	__be32			rr_xid;
	__be32			rr_proc;
	void			*rr_buf;
	u64			rr_dma;
	struct ib_sge		rr_sge;
	struct ib_recv_wr	rr_recv_wr;
};

struct rbx_req {
	struct list_head	rl_free;
	struct list_head	rl_registered;
	struct rbx_rep		*rl_reply;
	__be32			rl_xid;
	void			*rl_task;	/* RPC task, NULL when idle */
	void			*rl_sendbuf;
	u64			rl_send_dma;
	struct ib_sge		rl_send_sge;
	struct ib_send_wr	rl_send_wr;
	struct ib_cqe		rl_send_cqe;
};

struct rbx_ep {
	struct rdma_cm_id	*re_id;
	struct ib_cq		*re_cq;
	unsigned int		re_max_requests;
	unsigned int		re_send_batch;
	unsigned int		re_send_count;
};

struct rbx_xprt {
	struct ib_device	*rx_dev;
	struct ib_pd		*rx_pd;
	struct rbx_ep		*rx_ep;
	spinlock_t		rx_lock;
	struct list_head	rx_mrs_free;
	struct list_head	rx_mrs_all;
	unsigned int		rx_max_mrs;
	struct rbx_req		*rx_reqs;
	unsigned int		rx_nreqs;
	struct list_head	rx_reqs_free;
	struct work_struct	rx_refresh_work;
};

static inline struct rbx_mr *rbx_mr_pop(struct list_head *list)
{
	struct rbx_mr *mr;

	mr = list_first_entry_or_null(list, struct rbx_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	return mr;
}

static inline struct rbx_mr *rbx_mr_get(struct rbx_xprt *x)
{
	struct rbx_mr *mr;

	spin_lock(&x->rx_lock);
	mr = rbx_mr_pop(&x->rx_mrs_free);
	spin_unlock(&x->rx_lock);
	return mr;
}

static inline void rbx_mr_put(struct rbx_mr *mr)
{
	struct rbx_xprt *x = mr->mr_xprt;

	mr->mr_req = NULL;
	spin_lock(&x->rx_lock);
	list_add(&mr->mr_list, &x->rx_mrs_free);
	spin_unlock(&x->rx_lock);
}

static inline void rbx_mr_unmap_and_put(struct rbx_mr *mr)
{
	if (mr->mr_dir != DMA_NONE) {
		ib_dma_unmap_sg(mr->mr_xprt->rx_dev, mr->mr_sg, mr->mr_nents,
				mr->mr_dir);
		mr->mr_dir = DMA_NONE;
	}
	rbx_mr_put(mr);
}

/* rb_frwr.c */
int rbx_mrs_create(struct rbx_xprt *x);
void rbx_mrs_destroy(struct rbx_xprt *x);
void rbx_frwr_mr_release(struct rbx_mr *mr);
int rbx_frwr_map(struct rbx_xprt *x, struct rbx_req *req,
		 struct rbx_mr_seg *seg, int nsegs, bool writing);
int rbx_frwr_send(struct rbx_xprt *x, struct rbx_req *req);
void rbx_frwr_reset(struct rbx_req *req);
void rbx_frwr_reminv(struct rbx_rep *rep, struct list_head *mrs);
void rbx_frwr_unmap_sync(struct rbx_xprt *x, struct rbx_req *req);
void rbx_frwr_unmap_async(struct rbx_xprt *x, struct rbx_req *req);

/* rb_verbs.c */
void rbx_force_disconnect(struct rbx_xprt *x);
void rbx_complete_rqst(struct rbx_req *req, int status);

#endif /* RB_XPRT_H */
