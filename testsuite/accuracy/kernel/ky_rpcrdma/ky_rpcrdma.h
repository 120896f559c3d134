/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kyr: RPC-over-RDMA client transport, shared definitions.
 *
 *   verbs.c   - endpoint setup: QP sizing from a per-RPC work request
 *               budget, receive ring, MR list, teardown
 *   frwr.c    - FRWR registration: REG_MRs chained ahead of the RPC Call's
 *               Send, LOCAL_INV chain when the Reply has arrived
 *   marshal.c - RPC-over-RDMA header and chunk lists, Send path
 *
 * Each RPC may register up to KYR_MAX_SEGS MRs (read, write and reply
 * chunks together). The Call's Send is signaled only every send_batch
 * posts; the LOCAL_INV chain always ends with a signaled work request.
 *
 * Wrong: the per-RPC budget in verbs.c leaves out the LOCAL_INVs and is a
 * hand-made factor; the Send-signaling countdown is never counted down; the
 * reply-chunk access rights lack LOCAL_WRITE; the key "rotation" in
 * kyr_frwr_map() writes back the key the MR already has.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- lifetime checks are not the subject of this module
 */
#ifndef KY_RPCRDMA_H
#define KY_RPCRDMA_H

#include <linux/kernel.h>
#include <linux/types.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define KYR_MAX_SEGS		8	/* MRs per RPC, all chunk lists */
#define KYR_MAX_FR_PAGES	64
#define KYR_BC_WRS		4	/* backchannel Sends */
#define KYR_MIN_SLOTS		2
#define KYR_SEND_SGES		3	/* header, head, page list */
#define KYR_HDR_SIZE		1024
#define KYR_MR_BATCH		32

enum kyr_chunktype {
	kyr_noch = 0,
	kyr_readch,
	kyr_writech,
	kyr_replych,
};

struct kyr_seg {
	struct page	*page;
	u32		offset;
	u32		len;
};

struct kyr_xprt;

struct kyr_mr {
	struct list_head	mr_list;
	struct list_head	mr_all;
	struct ib_mr		*ibmr;
	struct scatterlist	*sg;
	int			nents;
	enum dma_data_direction	dir;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	linv_done;
	u32			handle;
	u32			length;
	u64			offset;
	struct kyr_xprt		*xprt;
};

struct kyr_ep {
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct ib_qp_init_attr	attr;
	unsigned int		max_requests;
	unsigned int		max_fr_depth;
	unsigned int		send_batch;
	unsigned int		send_count;
};

struct kyr_req {
	struct list_head	rl_free;
	struct list_head	rl_registered;
	struct ib_send_wr	rl_wr;
	struct ib_sge		rl_sge[KYR_SEND_SGES];
	struct ib_cqe		rl_cqe;
	void			*rl_hdrbuf;
	u64			rl_hdr_dma;
	u32			rl_xid;
	struct kyr_seg		rl_segs[KYR_MAX_SEGS * 4];
	int			rl_nsegs;
	int			rl_nmrs;
	enum kyr_chunktype	rl_rtype;
	enum kyr_chunktype	rl_wtype;
	struct kyr_xprt		*rl_xprt;
};

struct kyr_xprt {
	struct kyr_ep		*rx_ep;
	spinlock_t		rx_lock;
	struct list_head	rx_mrs;		/* free MRs */
	struct list_head	rx_all_mrs;
	unsigned int		rx_mr_count;
	struct work_struct	rx_refresh_worker;
	struct workqueue_struct	*rx_wq;
};

/* verbs.c */
int kyr_ep_create(struct kyr_xprt *r_xprt, struct rdma_cm_id *id);
void kyr_ep_destroy(struct kyr_xprt *r_xprt);
struct kyr_mr *kyr_mr_get(struct kyr_xprt *r_xprt);
void kyr_mr_put(struct kyr_mr *mr);
void kyr_mrs_refresh(struct kyr_xprt *r_xprt);

/* frwr.c */
int kyr_frwr_mr_init(struct kyr_xprt *r_xprt, struct kyr_mr *mr);
void kyr_frwr_mr_release(struct kyr_mr *mr);
struct kyr_seg *kyr_frwr_map(struct kyr_xprt *r_xprt, struct kyr_seg *seg,
			     int nsegs, enum kyr_chunktype type, u32 xid,
			     struct kyr_mr *mr);
int kyr_frwr_send(struct kyr_xprt *r_xprt, struct kyr_req *req);
void kyr_frwr_unmap_sync(struct kyr_xprt *r_xprt, struct kyr_req *req);
void kyr_frwr_reset(struct kyr_req *req);

/* marshal.c */
int kyr_marshal_req(struct kyr_xprt *r_xprt, struct kyr_req *req);
int kyr_send_call(struct kyr_xprt *r_xprt, struct kyr_req *req);
void kyr_reply_done(struct kyr_req *req);

/* RPC client layer */
void kyr_complete_rqst(struct kyr_req *req);

#endif /* KY_RPCRDMA_H */
