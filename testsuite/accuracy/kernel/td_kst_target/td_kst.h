/* SPDX-License-Identifier: GPL-2.0 */
/*
 * td_kst.h - block target over RDMA, nvmet-rdma / isert style.
 *
 * Host data moves with the core R/W API: an RDMA READ context
 * (rdma_rw_ctx_init(DMA_FROM_DEVICE) + rdma_rw_ctx_post() with a cqe) pulls
 * write data, RDMA WRITE contexts are chained in front of the signaled
 * response SEND.  The QP declares max_rdma_ctxs; send-queue credits
 * (sq_wr_avail) cover everything the target posts itself.
 *
 * Older pull paths: "immediate" (one page, plain RDMA READ into a page
 * addressed with the PD's local_dma_lkey) and "keyed" (private FRWR pool,
 * LOCAL_INV on reuse, READ_WITH_INV where the device can).  Event
 * notifications are SENDs meant to be signaled every 16th time.
 *
 * Problems: the immediate pull's sink has no remote write (the READ fails
 * on iWARP); the keyed pull chooses its access rights with an inline
 * transport test; the notification counter is never advanced; the receive
 * depth is a constant above what every device supports.
 *
 * td_kst_qp.c sets up and tears down the queue, td_kst_io.c moves data.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#ifndef TD_KST_H
#define TD_KST_H

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>
#include <rdma/mr_pool.h>

#define KST_SQ_DEPTH		2048
#define KST_RQ_DEPTH		2048
#define KST_MAX_PAGES		256
#define KST_PULL_MAX_PAGES	32
#define KST_CAPSULE_SIZE	128
#define KST_PAGE_SIZE		4096
#define KST_NOTIFY_SIGNAL_EVERY	16

struct kst_capsule {
	u8	opcode;
	u8	flags;		/* KST_F_IMMEDIATE, KST_F_KEYED */
	u16	cid;
	u32	len;
	u64	raddr;
	u32	rkey;
	u32	rsvd;
};
#define KST_F_IMMEDIATE	0x1
#define KST_F_KEYED	0x2

struct kst_device {
	struct ib_device	*ib;
	struct ib_pd		*pd;
};

struct kst_queue;

struct kst_cmd {
	struct ib_cqe		cqe;
	struct kst_queue	*queue;
	struct kst_capsule	*capsule;
	u64			dma;
	struct ib_sge		sge;
	struct ib_recv_wr	wr;
};

struct kst_rsp {
	struct kst_queue	*queue;
	struct kst_cmd		*cmd;
	u64			remote_addr;
	u32			rkey;
	u32			len;
	enum dma_data_direction	dir;

	struct rdma_rw_ctx	rw;
	bool			rw_used;
	int			n_rdma;
	struct scatterlist	*sg;
	u32			sg_cnt;
	struct ib_cqe		read_cqe;

	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	int			send_credits;
	struct ib_cqe		send_cqe;

	/* immediate pull */
	void			*imm_page;
	u64			imm_dma;
	struct ib_sge		imm_sge;
	struct ib_rdma_wr	imm_wr;

	/* keyed pull */
	struct ib_mr		*pull_mr;
	struct ib_send_wr	pull_inv;
	struct ib_reg_wr	pull_reg;
	struct ib_rdma_wr	pull_wr;
	struct ib_sge		pull_sge;
	struct ib_cqe		pull_cqe;
};

struct kst_queue {
	struct kst_device	*dev;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			port_num;
	int			comp_vector;
	unsigned int		nr_cqe;
	int			send_queue_size;
	atomic_t		sq_wr_avail;
	atomic_t		notify_unsignaled;
	u32			max_read_sge;
	struct list_head	pull_mrs;
	struct kst_cmd		*cmds;
	struct kst_rsp		*rsps;

	struct ib_cqe		notify_cqe;
	u32			*notify_buf;
	u64			notify_dma;
};

/* td_kst_qp.c */
int kst_post_recv(struct kst_queue *queue, struct kst_cmd *cmd);
int kst_create_queue_ib(struct kst_queue *queue);
void kst_destroy_queue_ib(struct kst_queue *queue);

/* td_kst_io.c */
void kst_handle_capsule(struct kst_queue *queue, struct kst_cmd *cmd, struct kst_rsp *rsp);
int kst_send_notify(struct kst_queue *queue, u32 event);

#endif /* TD_KST_H */
