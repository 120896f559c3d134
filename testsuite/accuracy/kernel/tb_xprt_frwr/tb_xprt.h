/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/*
 * tb_xprt.h - RPC-over-RDMA client transport (xprtrdma style): shared
 * definitions for FRWR memory registration (tb_frwr.c), endpoint and buffer
 * management (tb_verbs.c), and RPC marshaling and reply handling
 * (tb_rpc_rdma.c).
 *
 * Chunks are registered with FRWR: each MR is DMA-mapped and fast-registered
 * by a REG_MR chained in front of the RPC Call SEND, and its handle goes
 * into the chunk lists. A Reply may carry the remote invalidation of one MR,
 * which is checked against the MR handles; the remaining MRs are invalidated
 * with a chain of signaled LOCAL_INVs and put back from their completions.
 * The send queue is sized in frwr_query_device() from a per-RPC WR count.
 *
 * Known problems: frwr_mr_init() returns an allocation error with the MR it
 * allocated left in place; the asynchronous LOCAL_INV completion puts the MR
 * back even when the invalidation was flushed; the retransmit path recycles
 * stale MRs right after posting unsignaled LOCAL_INVs; the send queue depth
 * is a hand-made per-RPC factor.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-rkey-reuse, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this program
 */
#ifndef TB_XPRT_H
#define TB_XPRT_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define XPR_MAX_DATA_SEGS	256	/* pages in one payload */
#define XPR_MAX_HDR_SEGS	16
#define XPR_MAX_SEGS		(XPR_MAX_DATA_SEGS + XPR_MAX_HDR_SEGS)
#define XPR_BACKWARD_WRS	8
#define XPR_MIN_SLOT_TABLE	4

struct xpr_xprt;
struct xpr_req;

struct xpr_mr {
	struct list_head	mr_list;
	struct list_head	mr_all;
	struct xpr_req		*mr_req;
	struct ib_mr		*mr_ibmr;
	struct ib_device	*mr_device;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	struct ib_cqe		mr_cqe;
	struct completion	mr_linv_done;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct xpr_xprt		*mr_xprt;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
};

struct xpr_mr_seg {
	u32			mr_len;
	struct page		*mr_page;
	unsigned int		mr_pgoff;
};

struct xpr_rep {
	struct ib_cqe		rr_cqe;
	__be32			rr_xid;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
	struct xpr_xprt		*rr_rxprt;
	void			*rr_buf;
	u32			rr_len;
};

struct xpr_req {
	struct list_head	rl_registered;
	struct xpr_rep		*rl_reply;
	struct ib_send_wr	rl_wr;
	struct ib_sge		rl_sge[2];
	struct ib_cqe		rl_cqe;
	struct xpr_mr_seg	rl_segments[XPR_MAX_SEGS];
	int			rl_nsegs;
	__be32			rl_xid;
	bool			rl_writing;
	__be32			*rl_chunks;	/* encoded handle/length/offset triples */
};

struct xpr_ep {
	struct rdma_cm_id	*re_id;
	struct ib_pd		*re_pd;
	struct ib_cq		*re_send_cq;
	struct ib_cq		*re_recv_cq;
	unsigned int		re_max_fr_depth;
	enum ib_mr_type		re_mrtype;
	unsigned int		re_max_requests;
	struct ib_qp_init_attr	re_attr;
};

struct xpr_buffer {
	spinlock_t		rb_lock;
	struct list_head	rb_mrs;
	struct list_head	rb_all_mrs;
	u32			rb_max_requests;
};

struct xpr_xprt {
	struct xpr_ep		*rx_ep;
	struct xpr_buffer	rx_buf;
};

static inline struct xpr_mr *xpr_mr_pop(struct list_head *list)
{
	struct xpr_mr *mr;

	mr = list_first_entry_or_null(list, struct xpr_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	return mr;
}

static inline void xpr_mr_push(struct xpr_mr *mr, struct list_head *list)
{
	list_add_tail(&mr->mr_list, list);
}

/* tb_frwr.c */
int frwr_query_device(struct xpr_ep *ep, const struct ib_device *device);
int frwr_mr_init(struct xpr_xprt *r_xprt, struct xpr_mr *mr);
void frwr_mr_release(struct xpr_mr *mr);
void frwr_reset(struct xpr_req *req);
struct xpr_mr_seg *frwr_map(struct xpr_xprt *r_xprt, struct xpr_mr_seg *seg,
			    int nsegs, bool writing, __be32 xid,
			    struct xpr_mr *mr);
int frwr_send(struct xpr_xprt *r_xprt, struct xpr_req *req);
void frwr_reminv(struct xpr_rep *rep, struct list_head *mrs);
void frwr_unmap_sync(struct xpr_xprt *r_xprt, struct xpr_req *req);
void frwr_unmap_async(struct xpr_xprt *r_xprt, struct xpr_req *req);
void frwr_unmap_stale(struct xpr_xprt *r_xprt, struct xpr_req *req);

/* tb_verbs.c */
struct xpr_mr *xpr_mr_get(struct xpr_xprt *r_xprt);
void xpr_force_disconnect(struct xpr_ep *ep);
void xpr_complete_rqst(struct xpr_rep *rep);
int xpr_ep_create(struct xpr_xprt *r_xprt, struct rdma_cm_id *id);
void xpr_ep_destroy(struct xpr_xprt *r_xprt);

/* tb_rpc_rdma.c */
void xpr_reply_handler(struct xpr_rep *rep);

#endif /* TB_XPRT_H */
