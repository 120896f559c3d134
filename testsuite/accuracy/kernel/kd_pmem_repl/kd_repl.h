// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
/* SPDX-License-Identifier: GPL-2.0 */
/* kd_repl.h - pmem replication target over RDMA: shared definitions. */
#ifndef KD_REPL_H
#define KD_REPL_H

#include <linux/types.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/printk.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define KD_REPL_WIN_PAGES	256
#define KD_REPL_RECV_DEPTH	2048
#define KD_REPL_ACK_EVERY	16
#define KD_REPL_GRANT_TMO_MS	10000

enum { KD_REPL_OP_HELLO = 1, KD_REPL_OP_GRANT, KD_REPL_OP_COMMIT,
       KD_REPL_OP_DISCARD, KD_REPL_OP_CLOSE, KD_REPL_OP_ACK,
       KD_REPL_OP_COMMIT_V1, KD_REPL_OP_TRUNCATE };
enum kd_win_state { KD_WIN_FREE, KD_WIN_GRANTED, KD_WIN_INV_PENDING };

struct kd_repl_msg {
	__le32	op;
	__le32	win;
	__le32	rkey;
	__le64	addr;
	__le64	len;
};

struct kd_repl_win {
	struct kd_repl_conn	*conn;
	struct list_head	 list;		/* conn->free_wins */
	unsigned int		 idx;
	enum kd_win_state	 state;
	struct ib_mr		*mr;
	struct scatterlist	*sg;
	int			 nents;
	int			 wc_flags;	/* copied from the COMMIT */
	u32			 inv_rkey;
	struct ib_reg_wr	 reg_wr;	/* REG_MR -> grant_wr */
	struct ib_send_wr	 grant_wr;
	struct ib_sge		 grant_sge;
	struct kd_repl_msg	 grant_msg;
	struct ib_send_wr	 inv_wr;
	struct ib_cqe		 inv_cqe;
	struct delayed_work	 expire;
	struct work_struct	 commit_work;
};

struct kd_repl_recv {
	struct kd_repl_conn	*conn;
	struct ib_recv_wr	 wr;
	struct ib_sge		 sge;
	struct ib_cqe		 cqe;
	struct kd_repl_msg	 msg;
};

struct kd_repl_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	unsigned int		 nr_windows;
	struct kd_repl_win	*win;
	spinlock_t		 lock;
	struct list_head	 free_wins;
	struct kd_repl_recv	*recvs;
	/* tail record, hidden during resync and exposed again after */
	u64			*tail;
	struct scatterlist	 tail_sg;
	struct ib_mr		*tail_mr;
	bool			 tail_exposed;
	struct ib_reg_wr	 tail_reg_wr;
	struct ib_send_wr	 tail_inv_wr;
	struct ib_cqe		 tail_inv_cqe;
	struct completion	 tail_inv_done;
	/* control sends (HELLO, ACK) */
	struct ib_send_wr	 ctl_wr;
	struct ib_cqe		 ctl_cqe;
	struct ib_sge		 ctl_sge;
	struct kd_repl_msg	 ctl_msg;
	unsigned int		 acks_since_signal;
};

/* kd_repl_conn.c */
int kd_repl_conn_setup(struct kd_repl_conn *conn);
int kd_repl_expose_tail(struct kd_repl_conn *conn);
void kd_repl_hide_tail(struct kd_repl_conn *conn);
void kd_repl_conn_destroy(struct kd_repl_conn *conn);
void kd_repl_conn_error(struct kd_repl_conn *conn);
/* kd_repl_data.c */
int kd_repl_grant_window(struct kd_repl_conn *conn, u64 pmem_off, u32 len);
int kd_repl_reclaim_window(struct kd_repl_win *win);
void kd_repl_put_window(struct kd_repl_win *win);
void kd_repl_abort_windows(struct kd_repl_conn *conn);
int kd_repl_send_ack(struct kd_repl_conn *conn, struct kd_repl_win *win);
void kd_repl_prep_ctl(struct kd_repl_conn *conn, u32 op, u32 win, int flags);
void kd_repl_window_expire(struct work_struct *work);
int kd_repl_pmem_to_sg(struct kd_repl_conn *conn, u64 off, u32 len,
		       struct scatterlist *sg);		/* DAX glue */
void kd_repl_persist(struct kd_repl_win *win);		/* DAX glue */
/* kd_repl_comp.c */
void kd_repl_recv_done(struct ib_cq *cq, struct ib_wc *wc);
void kd_repl_inv_done(struct ib_cq *cq, struct ib_wc *wc);
void kd_repl_commit_work(struct work_struct *work);
void kd_repl_ctl_done(struct ib_cq *cq, struct ib_wc *wc);
void kd_repl_tail_inv_done(struct ib_cq *cq, struct ib_wc *wc);

#endif /* KD_REPL_H */
