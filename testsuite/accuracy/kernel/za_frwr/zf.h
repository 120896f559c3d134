/* SPDX-License-Identifier: GPL-2.0 */
/*
 * zf.h - shared definitions of an xprtrdma-style RPC-over-RDMA client
 * transport that registers RPC chunks with FRWR.
 *
 * frwr_ops.c  MR setup/teardown, chunk registration, LOCAL_INV chains
 * rpc_rdma.c  marshaling, reply handling, RPC cancellation
 * verbs.c     receive completion, MR list creation
 *
 * MRs live on xprt->rx_mrs (free list, taken from the head) and, while
 * an RPC uses them, on req->rl_registered.  A reply whose Send carried a
 * remote invalidation releases the matching MR; the rest are invalidated
 * with a chain of LOCAL_INVs of which only the last is signaled (send
 * queue ordering retires the others with it).
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed for this module
 */
#ifndef ZF_H
#define ZF_H

#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>

#define ZF_MAX_SEGS		64
#define ZF_MAX_CHUNK_MRS	8

struct zf_xprt;
struct zf_req;

struct zf_mr {
	struct list_head	mr_list;	/* rx_mrs or rl_registered */
	struct list_head	mr_all;		/* rx_all_mrs */
	struct zf_req		*mr_req;
	struct zf_xprt		*mr_xprt;
	struct ib_mr		*mr_ibmr;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct ib_cqe		mr_cqe;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
};

struct zf_seg {
	struct page		*page;
	unsigned int		offset;
	unsigned int		len;
};

struct zf_rep {
	struct ib_cqe		rr_cqe;
	struct zf_xprt		*rr_xprt;
	u32			rr_xid;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
	u32			rr_status;
	void			*rr_buf;
};

struct zf_req {
	struct list_head	rl_free;
	struct list_head	rl_registered;
	struct zf_rep		*rl_reply;
	u32			rl_xid;
	bool			rl_busy;
	struct ib_cqe		rl_inv_cqe;
	struct completion	rl_inv_done;
	int			rl_inv_status;
	struct ib_send_wr	rl_send_wr;
	struct ib_sge		rl_send_sge;
	struct ib_cqe		rl_send_cqe;
	void			(*rl_complete)(struct zf_req *req, int status);
};

struct zf_xprt {
	struct ib_device	*rx_dev;
	struct ib_pd		*rx_pd;
	struct ib_qp		*rx_qp;
	spinlock_t		rx_mr_lock;
	struct list_head	rx_mrs;
	struct list_head	rx_all_mrs;
	unsigned int		rx_max_depth;
	unsigned int		rx_max_mrs;
	struct list_head	rx_free_reqs;
	struct work_struct	rx_disconnect_work;
	bool			rx_connected;
};

/* frwr_ops.c */
int zf_mr_init(struct zf_xprt *xprt, struct zf_mr *mr);
void zf_mr_release(struct zf_mr *mr);
struct zf_mr *zf_mr_get(struct zf_xprt *xprt);
void zf_mr_put(struct zf_mr *mr);
struct zf_seg *zf_map(struct zf_xprt *xprt, struct zf_seg *seg, int nsegs,
		      bool writing, u32 xid, struct zf_mr *mr);
int zf_send(struct zf_xprt *xprt, struct zf_req *req);
void zf_reminv(struct zf_xprt *xprt, u32 inv_rkey, struct list_head *mrs);
int zf_unmap_sync(struct zf_xprt *xprt, struct zf_req *req);
void zf_unmap_async(struct zf_xprt *xprt, struct zf_req *req);
void zf_reset(struct zf_req *req);
void zf_force_disconnect(struct zf_xprt *xprt);

/* verbs.c */
void zf_mrs_create(struct zf_xprt *xprt);
void zf_mrs_destroy(struct zf_xprt *xprt);

/* xid table, kept by the RPC client core */
struct zf_req *zf_xid_lookup(struct zf_xprt *xprt, u32 xid);

/* rpc_rdma.c */
void zf_reply_handler(struct zf_rep *rep);
void zf_complete_rqst(struct zf_req *req, int status);

#endif /* ZF_H */
