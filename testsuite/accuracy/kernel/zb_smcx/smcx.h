/* SPDX-License-Identifier: GPL-2.0 */
/*
 * smcx.h - shared definitions of an SMC-R style module (shared memory
 * communications over RDMA).
 *
 * A link group connects two hosts over up to SMCX_LINKS_PER_LGR RC links,
 * one QP each. Every RMB (the receive buffer a connection's peer writes
 * into) is registered on every link of its group and its rkey announced to
 * the peer; send buffers are DMA mapped and addressed with the PD's local
 * DMA lkey, except virtually contiguous ones, which get a local-only MR so
 * one SGE covers them. Data moves by RDMA WRITE from the local send buffer
 * into the peer's RMB, followed by a CDC message (a SEND from one of
 * SMCX_WR_BUF_CNT tx slots per link) announcing the new producer cursor;
 * a write that wraps the ring takes two RDMA WRITEs.
 *
 * Files: link.c (link group, QPs, teardown), mr.c (buffers and their MRs),
 * wr.c (work requests: CDC sends, registration, receives).
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed for this module
 */
#ifndef SMCX_H
#define SMCX_H

#include <linux/kernel.h>
#include <linux/types.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>

#define SMCX_LINKS_PER_LGR	3
#define SMCX_WR_BUF_CNT		512	/* CDC tx slots per link */
#define SMCX_WR_RX_CNT		(SMCX_WR_BUF_CNT * 3)
#define SMCX_WR_BUF_SIZE	48
#define SMCX_MAX_SEND_SGE	2
#define SMCX_RX_SGE		1
#define SMCX_RMBE_SIZES		16
#define SMCX_WR_REG_WAIT_MS	5000

struct smcx_link;
struct smcx_lgr;

struct smcx_wr_tx_pend {
	struct ib_cqe		cqe;
	struct smcx_link	*link;
	u32			idx;
	void			(*handler)(struct smcx_wr_tx_pend *pend, int status);
};

struct smcx_wr_rx_pend {
	struct ib_cqe		cqe;
	struct smcx_link	*link;
	u32			idx;
};

struct smcx_buf_desc {
	struct list_head	list;
	void			*cpu_addr;
	size_t			len;
	int			nr_pages;
	bool			is_rmb;
	bool			is_vm;
	bool			used;
	struct sg_table		sgt[SMCX_LINKS_PER_LGR];
	struct ib_mr		*mr[SMCX_LINKS_PER_LGR];
	bool			is_map_ib[SMCX_LINKS_PER_LGR];
};

struct smcx_link {
	struct smcx_lgr		*lgr;
	int			link_idx;
	bool			active;
	struct ib_device	*ibdev;
	u32			ibport;
	struct ib_pd		*roce_pd;
	struct ib_qp		*roce_qp;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;

	/* tx: one CDC SEND and up to two RDMA WRITEs per slot */
	u8			*wr_tx_bufs;
	u64			wr_tx_dma_addr;
	struct ib_send_wr	wr_tx_ibs[SMCX_WR_BUF_CNT];
	struct ib_sge		wr_tx_sges[SMCX_WR_BUF_CNT];
	struct ib_rdma_wr	wr_tx_rdmas[SMCX_WR_BUF_CNT][2];
	struct ib_sge		wr_tx_rdma_sges[SMCX_WR_BUF_CNT][2];
	struct smcx_wr_tx_pend	wr_tx_pends[SMCX_WR_BUF_CNT];
	bool			wr_tx_used[SMCX_WR_BUF_CNT];
	spinlock_t		wr_tx_lock;
	wait_queue_head_t	wr_tx_wait;

	/* rx */
	u8			*wr_rx_bufs;
	u64			wr_rx_dma_addr;
	struct ib_recv_wr	wr_rx_ibs[SMCX_WR_RX_CNT];
	struct ib_sge		wr_rx_sges[SMCX_WR_RX_CNT];
	struct smcx_wr_rx_pend	wr_rx_pends[SMCX_WR_RX_CNT];

	/* memory registration, one at a time */
	struct mutex		wr_reg_mutex;
	struct ib_reg_wr	wr_reg;
	struct ib_cqe		wr_reg_cqe;
	struct completion	wr_reg_done;
	int			wr_reg_status;
};

struct smcx_lgr {
	struct smcx_link	lnk[SMCX_LINKS_PER_LGR];
	struct mutex		bufs_lock;
	struct list_head	rmbs[SMCX_RMBE_SIZES];
	struct list_head	sndbufs[SMCX_RMBE_SIZES];
};

/* link.c */
int smcx_link_init(struct smcx_lgr *lgr, int idx, struct ib_device *ibdev,
		   u32 ibport);
void smcx_link_clear(struct smcx_link *lnk);

/* mr.c */
struct smcx_buf_desc *smcx_buf_create(struct smcx_lgr *lgr, bool is_rmb,
				      int size_idx);
void smcx_buf_free(struct smcx_lgr *lgr, struct smcx_buf_desc *buf);
void smcx_buf_unmap_link(struct smcx_buf_desc *buf, struct smcx_link *lnk);
u32 smcx_rmb_rkey(struct smcx_buf_desc *rmb, struct smcx_link *lnk);
struct page *smcx_buf_page(struct smcx_buf_desc *buf, int i);

/* wr.c */
int smcx_wr_alloc_link_mem(struct smcx_link *lnk);
void smcx_wr_free_link_mem(struct smcx_link *lnk);
int smcx_wr_rx_post_all(struct smcx_link *lnk);
int smcx_wr_reg_send(struct smcx_link *lnk, struct ib_mr *mr, bool is_rmb);
int smcx_cdc_send(struct smcx_link *lnk, struct smcx_buf_desc *sndbuf,
		  u32 off, u32 len, u32 ring_size, u64 peer_addr,
		  u32 peer_rkey, const void *cdc, u32 cdc_len);
void smcx_cdc_rx(struct smcx_link *lnk, const void *msg, u32 len);

#endif /* SMCX_H */
