/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rdmx: an RPC-over-RDMA client transport in the shape of
 * net/sunrpc/xprtrdma (verbs.c, frwr_ops.c, rpc_rdma.c), written fresh for
 * the accuracy corpus. Shared declarations of the three files.
 */
#ifndef _XPRT_RDMX_H
#define _XPRT_RDMX_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDMX_MAX_DATA_SEGS	64
#define RDMX_BACKWARD_WRS	8
#define RDMX_MAX_SEND_SGES	18

struct rdmx_ep {
	struct rdma_cm_id	*re_id;
	struct ib_pd		*re_pd;
	struct ib_qp_init_attr	re_attr;
	unsigned int		re_max_requests;
	unsigned int		re_max_fr_depth;
	unsigned int		re_send_batch;
	unsigned int		re_send_count;
	enum ib_mr_type		re_mrtype;
};

struct rdmx_xprt;

struct rdmx_mr {
	struct list_head	mr_list;
	struct rdmx_xprt	*mr_xprt;
	struct ib_mr		*mr_ibmr;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct ib_cqe		mr_cqe;
	struct completion	mr_linv_done;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
};

struct rdmx_rep {
	struct ib_cqe		rr_cqe;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
	u32			rr_xid;
};

struct rdmx_req {
	struct list_head	rl_registered;
	struct list_head	rl_free_mrs;
	struct ib_send_wr	rl_send_wr;
	struct ib_cqe		rl_cqe;
	int			rl_refs;
};

struct rdmx_xprt {
	struct rdmx_ep		*rx_ep;
	struct ib_device	*rx_device;
	spinlock_t		rx_mr_lock;
	struct list_head	rx_mrs;
};

/* verbs.c */
int rdmx_ep_create(struct rdmx_xprt *r_xprt, struct rdmx_ep *ep);
void rdmx_ep_destroy(struct rdmx_ep *ep);
void rdmx_mr_put(struct rdmx_mr *mr);
void rdmx_force_disconnect(struct rdmx_xprt *r_xprt);
struct rdmx_req *rdmx_lookup_rqst(struct rdmx_xprt *r_xprt, u32 xid);
void rdmx_complete_rqst(struct rdmx_req *req);

/* frwr_ops.c */
int rdmx_frwr_mr_init(struct rdmx_xprt *r_xprt, struct rdmx_mr *mr);
void rdmx_frwr_mr_release(struct rdmx_mr *mr);
int rdmx_frwr_map(struct rdmx_xprt *r_xprt, struct rdmx_mr *mr, int nsegs,
		  bool writing);
int rdmx_frwr_send(struct rdmx_xprt *r_xprt, struct rdmx_req *req);
void rdmx_frwr_reminv(struct rdmx_rep *rep, struct list_head *mrs);
void rdmx_frwr_unmap_sync(struct rdmx_xprt *r_xprt, struct rdmx_req *req);
void rdmx_frwr_reset(struct rdmx_req *req);

#endif /* _XPRT_RDMX_H */
