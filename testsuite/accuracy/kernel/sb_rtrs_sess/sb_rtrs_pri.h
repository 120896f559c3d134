/* SPDX-License-Identifier: GPL-2.0 */
/*
 * sb_rtrs_pri.h - RTRS style block transport, client side: definitions
 * shared by the connection code (sb_rtrs_core.c) and the I/O path
 * (sb_rtrs_clt.c).
 *
 * A path to the server has one admin connection (cid 0: info exchange,
 * heartbeats) and con_num - 1 I/O connections, each with its own CQ and
 * QP.  Requests ("permits") are a table per path; a permit is taken by
 * scanning for a free entry.  For a READ the client registers the
 * destination with FRWR and RDMA-writes the request message, carrying
 * the rkey, into the server's chunk buffer.  The server writes the data
 * and answers with an immediate; with always-invalidate it precedes the
 * immediate with a SEND_WITH_INV of the client's rkey.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this program
 */
#ifndef SB_RTRS_PRI_H
#define SB_RTRS_PRI_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SBR_ADMIN_MSGS		8	/* info request, heartbeats */
#define SBR_WRS_PER_IO		2	/* REG_MR + the request; the server invalidates */
#define SBR_IO_TIMEOUT_MS	30000

enum sbr_imm_type {
	SBR_IO_REQ_IMM		= 0,
	SBR_IO_RSP_IMM		= 1,
	SBR_IO_RSP_W_INV_IMM	= 2,
	SBR_HB_MSG_IMM		= 8,
	SBR_HB_ACK_IMM		= 9,
};

struct sbr_path;
struct sbr_con;

struct sbr_iu {
	struct ib_cqe		cqe;
	struct sbr_con		*con;
	void			*buf;
	u64			dma_addr;
	size_t			size;
};

struct sbr_con {
	struct sbr_path		*path;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	unsigned int		cid;
	unsigned int		cq_size;
	struct ib_cqe		hb_cqe;
};

struct sbr_sg_desc {
	__le64	addr;
	__le32	key;
	__le32	len;
};

struct sbr_msg_rdma_read {
	u16			type;
	u16			usr_len;
	u16			sg_cnt;
	u16			flags;
	struct sbr_sg_desc	desc;
};

struct sbr_clt_io_req {
	struct sbr_con		*con;
	struct sbr_iu		*iu;
	struct scatterlist	*sglist;
	unsigned int		sg_size;
	unsigned int		sg_cnt;
	unsigned int		usr_len;
	bool			in_use;
	bool			need_inv;
	bool			need_inv_comp;
	int			inv_errno;
	struct ib_mr		*mr;
	struct ib_cqe		inv_cqe;
	struct completion	inv_comp;
	struct ib_reg_wr	rwr;
	struct ib_rdma_wr	imm_wr;
	struct ib_sge		sge;
	unsigned long		start_jiffies;
	void			*priv;
	void			(*conf)(void *priv, int errno);
};

struct sbr_path {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct sbr_con		**con;
	unsigned int		con_num;
	unsigned int		queue_depth;
	unsigned int		max_pages_per_mr;
	struct sbr_clt_io_req	*reqs;
	u64			*srv_addr;	/* one chunk per permit */
	u32			srv_rkey;
	spinlock_t		lock;
	unsigned int		next_con;
	struct delayed_work	reaper_dwork;
	struct work_struct	err_recovery_work;
};

/* sb_rtrs_core.c */
int sbr_con_create_qp(struct sbr_con *con);
void sbr_con_destroy_qp(struct sbr_con *con);
int sbr_post_local_inv(struct sbr_con *con, struct ib_cqe *cqe, u32 rkey,
		       bool signal);
int sbr_iu_post_recv(struct sbr_con *con, struct sbr_iu *iu);
int sbr_send_hb(struct sbr_con *con);
void sbr_err_recovery(struct sbr_path *path);
u32 sbr_to_imm(u32 type, u32 payload);
void sbr_from_imm(u32 imm, u32 *type, u32 *payload);

/* sb_rtrs_clt.c */
void sbr_clt_rdma_done(struct ib_cq *cq, struct ib_wc *wc);
int sbr_alloc_reqs(struct sbr_path *path);
void sbr_free_reqs(struct sbr_path *path);
int sbr_clt_read(struct sbr_path *path, struct scatterlist *sg,
		 unsigned int sg_size, void *msg, unsigned int usr_len,
		 void (*conf)(void *priv, int errno), void *priv);

#endif /* SB_RTRS_PRI_H */
