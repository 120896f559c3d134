/* SPDX-License-Identifier: GPL-2.0 */
/*
 * sdx: an SMB-Direct-client-style transport (fs/smb/client/smbdirect.c
 * shape) split into connection handling (smbd_conn.c) and memory
 * registration (smbd_mr.c), written fresh for the accuracy corpus.
 */
#ifndef _SMBDX_H
#define _SMBDX_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/wait.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SDX_MAX_SEND_SGE	6
#define SDX_MAX_RECV_SGE	1

enum sdx_mr_state {
	SDX_MR_READY,
	SDX_MR_REGISTERED,
	SDX_MR_INVALIDATED,
	SDX_MR_ERROR,
};

struct sdx_conn;

struct sdx_mr {
	struct sdx_conn		*conn;
	struct list_head	list;
	enum sdx_mr_state	state;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	invalidate_done;
	bool			need_invalidate;
};

struct sdx_conn {
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	int			send_credit_target;
	int			receive_credit_max;
	int			responder_resources;
	u32			max_frmr_depth;
	struct list_head	mr_list;
	struct sdx_mr		*last_registered;
	atomic_t		mr_ready_count;
	wait_queue_head_t	wait_mr;
};

/* smbd_mr.c */
int sdx_allocate_mr_list(struct sdx_conn *conn);
void sdx_destroy_mr_list(struct sdx_conn *conn);

#endif /* _SMBDX_H */
