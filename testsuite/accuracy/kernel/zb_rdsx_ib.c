// SPDX-License-Identifier: GPL-2.0
/*
 * zb_rdsx_ib.c - IB transport of a reliable datagram socket family.
 *
 * Each connection owns one RC QP, a send ring and a pool of fast
 * registration MRs allocated at connection setup. Applications hand buffers
 * to the socket for RDMA by their peers (rdsx_get_mr): a pool MR is mapped
 * and registered with IB_WR_REG_MR and its rkey returned as the cookie the
 * application puts in its message; rdsx_free_mr() posts the LOCAL_INV.
 * REG/INV work requests are budgeted by i_fastreg_wrs, everything else by
 * i_sq_free, and max_send_wr is the sum of both budgets plus the drain.
 *
 * At connection setup a 64-byte credit mailbox is registered with a pool MR
 * and its rkey sent in the private data so the peer can RDMA WRITE credit
 * updates into it; that registration omits IB_ACCESS_LOCAL_WRITE.
 * RDMA operations signal every rdsx_max_unsig_wrs-th post with a countdown;
 * congestion map updates use their own countdown that is reloaded but never
 * counted down. RDMA operations address the local pages with the PD's
 * local_dma_lkey, also when the operation is an RDMA READ.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed for this file
 */

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/wait.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDSX_FRMR_POOL		64
#define RDSX_FR_WRS		(2 * RDSX_FRMR_POOL)	/* a REG and an INV per pool MR */
#define RDSX_MR_PAGES		256
#define RDSX_MAX_SGE		8
#define RDSX_RECV_SGE		2
#define RDSX_CONG_SIGNAL_EVERY	16
#define RDSX_MAILBOX_SIZE	64

static unsigned int rdsx_send_wr = 256;
static unsigned int rdsx_recv_wr = 1024;
static unsigned int rdsx_max_unsig_wrs = 16;
module_param(rdsx_max_unsig_wrs, uint, 0644);

struct rdsx_conn;

struct rdsx_frmr {
	struct list_head	fr_list;
	struct rdsx_conn	*fr_ic;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		fr_cqe;
	struct completion	fr_comp;
	int			fr_status;
};

struct rdsx_send {
	struct ib_send_wr	s_wr;
	struct ib_rdma_wr	s_rdma_wr;
	struct ib_sge		s_sge[RDSX_MAX_SGE];
	struct ib_cqe		s_cqe;
	struct rdsx_conn	*s_ic;
	int			s_credits;
};

struct rdsx_rdma_op {
	bool			op_write;
	bool			op_notify;
	u32			op_rkey;
	u64			op_remote_addr;
	struct scatterlist	*op_sg;
	int			op_nents;
};

struct rdsx_conn {
	struct rdma_cm_id	*i_cm_id;
	struct ib_pd		*i_pd;
	struct ib_cq		*i_send_cq;
	struct ib_cq		*i_recv_cq;
	u32			i_send_ring_nr;
	u32			i_recv_ring_nr;
	int			i_max_sge;

	atomic_t		i_sq_free;
	atomic_t		i_fastreg_wrs;
	wait_queue_head_t	i_fastreg_wait;
	unsigned int		i_unsignaled_wrs;
	unsigned int		i_pending_unsig;
	unsigned int		i_cong_unsig;
	struct rdsx_send	i_cong_send;

	spinlock_t		i_frmr_lock;
	struct list_head	i_frmr_free;
	struct rdsx_frmr	*i_frmrs[RDSX_FRMR_POOL];

	void			*i_mailbox;
	struct scatterlist	i_mailbox_sg;
	struct rdsx_frmr	*i_mailbox_fr;
	u32			i_mailbox_rkey;
};

/* ---- FRMR pool ---- */

static void rdsx_frmr_release(struct rdsx_frmr *frmr)
{
	if (frmr->mr)
		ib_dereg_mr(frmr->mr);	/* BUG: rdma-local-mr-management -- the ULP frees its own fast-registration MRs */
	kfree(frmr);
}

static void rdsx_frmr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_frmr *frmr = container_of(wc->wr_cqe, struct rdsx_frmr, fr_cqe);
	struct rdsx_conn *ic = frmr->fr_ic;

	frmr->fr_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	if (wc->opcode == IB_WC_LOCAL_INV) {
		spin_lock(&ic->i_frmr_lock);
		list_add_tail(&frmr->fr_list, &ic->i_frmr_free);
		spin_unlock(&ic->i_frmr_lock);
	}
	atomic_inc(&ic->i_fastreg_wrs);
	wake_up(&ic->i_fastreg_wait);
	complete(&frmr->fr_comp);
}

static int rdsx_frmr_alloc_pool(struct rdsx_conn *ic)
{
	struct rdsx_frmr *frmr;
	int i;

	for (i = 0; i < RDSX_FRMR_POOL; i++) {
		frmr = kzalloc(sizeof(*frmr), GFP_KERNEL);
		if (!frmr)
			goto unwind;
		frmr->fr_ic = ic;
		frmr->fr_cqe.done = rdsx_frmr_done;
		init_completion(&frmr->fr_comp);
		frmr->mr = ib_alloc_mr(ic->i_pd, IB_MR_TYPE_MEM_REG, RDSX_MR_PAGES);	/* BUG: rdma-local-mr-management -- a hand-managed FRMR pool */
		if (IS_ERR(frmr->mr)) {
			frmr->mr = NULL;
			rdsx_frmr_release(frmr);
			goto unwind;
		}
		ic->i_frmrs[i] = frmr;
		list_add_tail(&frmr->fr_list, &ic->i_frmr_free);
	}
	atomic_set(&ic->i_fastreg_wrs, RDSX_FR_WRS);
	return 0;

unwind:
	while (--i >= 0) {
		rdsx_frmr_release(ic->i_frmrs[i]);
		ic->i_frmrs[i] = NULL;
	}
	INIT_LIST_HEAD(&ic->i_frmr_free);
	return -ENOMEM;
}

static struct rdsx_frmr *rdsx_frmr_get(struct rdsx_conn *ic)
{
	struct rdsx_frmr *frmr;

	spin_lock(&ic->i_frmr_lock);
	frmr = list_first_entry_or_null(&ic->i_frmr_free, struct rdsx_frmr, fr_list);
	if (frmr)
		list_del_init(&frmr->fr_list);
	spin_unlock(&ic->i_frmr_lock);
	return frmr;
}

static void rdsx_fastreg_take(struct rdsx_conn *ic)
{
	while (atomic_dec_return(&ic->i_fastreg_wrs) <= 0) {
		atomic_inc(&ic->i_fastreg_wrs);
		wait_event(ic->i_fastreg_wait, atomic_read(&ic->i_fastreg_wrs) > 1);
	}
}

/* Register an application buffer for remote access; returns the rkey. */
int rdsx_get_mr(struct rdsx_conn *ic, struct scatterlist *sg, int nents,
		struct rdsx_frmr **frmr_ret, u32 *key_ret)
{
	struct rdsx_frmr *frmr;
	int n, ret;

	frmr = rdsx_frmr_get(ic);
	if (!frmr)
		return -EAGAIN;

	n = ib_map_mr_sg(frmr->mr, sg, nents, NULL, PAGE_SIZE);	/* BUG: rdma-local-mr-management -- mapped by hand for an exposed key */
	if (n != nents) {
		ret = n < 0 ? n : -EINVAL;
		goto out_put;
	}

	ib_update_fast_reg_key(frmr->mr, ib_inc_rkey(frmr->mr->rkey));
	memset(&frmr->reg_wr, 0, sizeof(frmr->reg_wr));
	frmr->reg_wr.wr.wr_cqe = &frmr->fr_cqe;
	frmr->reg_wr.wr.opcode = IB_WR_REG_MR;	/* BUG: rdma-local-mr-management -- per-message REG_MR posted by the ULP */
	frmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	frmr->reg_wr.mr = frmr->mr;
	frmr->reg_wr.key = frmr->mr->rkey;
	/* OK: rdma-access-flags-invalid -- remote write and atomics come with local write */
	frmr->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			      IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_ATOMIC;

	rdsx_fastreg_take(ic);
	reinit_completion(&frmr->fr_comp);
	ret = ib_post_send(ic->i_cm_id->qp, &frmr->reg_wr.wr, NULL);
	if (ret) {
		atomic_inc(&ic->i_fastreg_wrs);
		goto out_put;
	}
	wait_for_completion(&frmr->fr_comp);
	if (frmr->fr_status) {
		ret = frmr->fr_status;
		goto out_put;
	}
	*frmr_ret = frmr;
	*key_ret = frmr->mr->rkey;
	return 0;

out_put:
	spin_lock(&ic->i_frmr_lock);
	list_add(&frmr->fr_list, &ic->i_frmr_free);
	spin_unlock(&ic->i_frmr_lock);
	return ret;
}

void rdsx_free_mr(struct rdsx_conn *ic, struct rdsx_frmr *frmr)
{
	memset(&frmr->inv_wr, 0, sizeof(frmr->inv_wr));
	frmr->inv_wr.wr_cqe = &frmr->fr_cqe;
	frmr->inv_wr.opcode = IB_WR_LOCAL_INV;
	frmr->inv_wr.send_flags = IB_SEND_SIGNALED;
	frmr->inv_wr.ex.invalidate_rkey = frmr->mr->rkey;

	rdsx_fastreg_take(ic);
	if (ib_post_send(ic->i_cm_id->qp, &frmr->inv_wr, NULL))
		atomic_inc(&ic->i_fastreg_wrs);
}

/* The peer RDMA WRITEs credit updates into i_mailbox. */
static int rdsx_setup_mailbox(struct rdsx_conn *ic)
{
	struct rdsx_frmr *frmr;
	int ret;

	ic->i_mailbox = kzalloc(RDSX_MAILBOX_SIZE, GFP_KERNEL);
	if (!ic->i_mailbox)
		return -ENOMEM;
	sg_init_one(&ic->i_mailbox_sg, ic->i_mailbox, RDSX_MAILBOX_SIZE);
	if (ib_dma_map_sg(ic->i_cm_id->device, &ic->i_mailbox_sg, 1,
			  DMA_FROM_DEVICE) != 1) {
		ret = -EIO;
		goto out_free;
	}

	frmr = rdsx_frmr_get(ic);
	if (!frmr) {
		ret = -ENOMEM;
		goto out_unmap;
	}
	ret = ib_map_mr_sg(frmr->mr, &ic->i_mailbox_sg, 1, NULL, PAGE_SIZE);	/* BUG: rdma-local-mr-management -- hand-made registration of the mailbox */
	if (ret != 1) {
		ret = -EINVAL;
		goto out_put;
	}
	memset(&frmr->reg_wr, 0, sizeof(frmr->reg_wr));
	frmr->reg_wr.wr.wr_cqe = &frmr->fr_cqe;
	frmr->reg_wr.wr.opcode = IB_WR_REG_MR;	/* BUG: rdma-local-mr-management -- REG_MR posted by the ULP at setup */
	frmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	frmr->reg_wr.mr = frmr->mr;
	frmr->reg_wr.key = frmr->mr->rkey;
	frmr->reg_wr.access = IB_ACCESS_REMOTE_WRITE;	/* BUG: rdma-access-flags-invalid -- remote write without IB_ACCESS_LOCAL_WRITE, the REG_MR completes in error */

	rdsx_fastreg_take(ic);
	reinit_completion(&frmr->fr_comp);
	ret = ib_post_send(ic->i_cm_id->qp, &frmr->reg_wr.wr, NULL);
	if (ret) {
		atomic_inc(&ic->i_fastreg_wrs);
		goto out_put;
	}
	wait_for_completion(&frmr->fr_comp);
	if (frmr->fr_status) {
		ret = frmr->fr_status;
		goto out_put;
	}
	ic->i_mailbox_fr = frmr;
	ic->i_mailbox_rkey = frmr->mr->rkey;
	return 0;

out_put:
	list_add(&frmr->fr_list, &ic->i_frmr_free);
out_unmap:
	ib_dma_unmap_sg(ic->i_cm_id->device, &ic->i_mailbox_sg, 1, DMA_FROM_DEVICE);
out_free:
	kfree(ic->i_mailbox);
	ic->i_mailbox = NULL;
	return ret;
}

/* ---- sends ---- */

static void rdsx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_send *send = container_of(wc->wr_cqe, struct rdsx_send, s_cqe);

	atomic_add(send->s_credits, &send->s_ic->i_sq_free);
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rdsx: send completion error %s\n", ib_wc_status_msg(wc->status));
}

static int rdsx_sq_take(struct rdsx_conn *ic, int nr)
{
	if (atomic_sub_return(nr, &ic->i_sq_free) < 0) {
		atomic_add(nr, &ic->i_sq_free);
		return -EAGAIN;
	}
	return 0;
}

/* Signal every rdsx_max_unsig_wrs-th work request; the signaled one gives
 * back the send-ring credits of everything posted since the last one. */
static void rdsx_set_wr_signal_state(struct rdsx_conn *ic, struct rdsx_send *send,
				     struct ib_send_wr *wr, bool notify)
{
	ic->i_pending_unsig++;
	/* OK: rdma-unsignaled-send-starvation -- the countdown is decremented on every post and reloaded when it hits zero */
	if (ic->i_unsignaled_wrs-- == 0 || notify) {
		ic->i_unsignaled_wrs = rdsx_max_unsig_wrs;
		wr->send_flags |= IB_SEND_SIGNALED;
		send->s_credits = ic->i_pending_unsig;
		ic->i_pending_unsig = 0;
	}
}

int rdsx_xmit_rdma(struct rdsx_conn *ic, struct rdsx_send *send,
		   struct rdsx_rdma_op *op)
{
	struct scatterlist *sg;
	int i, ret;

	if (op->op_nents > ic->i_max_sge)
		return -EINVAL;
	ret = rdsx_sq_take(ic, 1);
	if (ret)
		return ret;

	for_each_sg(op->op_sg, sg, op->op_nents, i) {
		send->s_sge[i].addr = sg_dma_address(sg);
		send->s_sge[i].length = sg_dma_len(sg);
		send->s_sge[i].lkey = ic->i_pd->local_dma_lkey;
	}
	send->s_ic = ic;
	send->s_cqe.done = rdsx_send_done;
	send->s_rdma_wr.wr.next = NULL;
	send->s_rdma_wr.wr.wr_cqe = &send->s_cqe;
	send->s_rdma_wr.wr.opcode = op->op_write ? IB_WR_RDMA_WRITE : IB_WR_RDMA_READ;
	send->s_rdma_wr.wr.sg_list = send->s_sge;
	send->s_rdma_wr.wr.num_sge = op->op_nents;
	send->s_rdma_wr.wr.send_flags = 0;
	send->s_rdma_wr.remote_addr = op->op_remote_addr;
	send->s_rdma_wr.rkey = op->op_rkey;
	rdsx_set_wr_signal_state(ic, send, &send->s_rdma_wr.wr, op->op_notify);

	/* BUG: rdma-access-flags-transport -- for !op_write this is an RDMA READ into pages addressed with local_dma_lkey, which has no remote write on iWARP */
	ret = ib_post_send(ic->i_cm_id->qp, &send->s_rdma_wr.wr, NULL);
	if (ret)
		atomic_add(1, &ic->i_sq_free);
	return ret;
}

/* Tell the peer about our congestion map (the map is already in s_sge). */
int rdsx_send_cong_update(struct rdsx_conn *ic)
{
	struct rdsx_send *send = &ic->i_cong_send;
	int ret;

	ret = rdsx_sq_take(ic, 1);
	if (ret)
		return ret;
	send->s_ic = ic;
	send->s_cqe.done = rdsx_send_done;
	send->s_credits = 1;
	send->s_wr.next = NULL;
	send->s_wr.wr_cqe = &send->s_cqe;
	send->s_wr.opcode = IB_WR_SEND;
	send->s_wr.sg_list = send->s_sge;
	send->s_wr.num_sge = 1;
	send->s_wr.send_flags = 0;
	/* BUG: rdma-unsignaled-send-starvation -- i_cong_unsig is reloaded here but nothing counts it down, so only the first update is signaled */
	if (!ic->i_cong_unsig) {
		send->s_wr.send_flags |= IB_SEND_SIGNALED;
		ic->i_cong_unsig = RDSX_CONG_SIGNAL_EVERY;
	}
	ret = ib_post_send(ic->i_cm_id->qp, &send->s_wr, NULL);
	if (ret)
		atomic_add(1, &ic->i_sq_free);
	return ret;
}

/* ---- connection setup ---- */

int rdsx_setup_qp(struct rdsx_conn *ic)
{
	struct ib_device *dev = ic->i_cm_id->device;
	struct ib_qp_init_attr attr;
	int ret;

	ic->i_send_ring_nr = min_t(u32, rdsx_send_wr,
				   dev->attrs.max_qp_wr - RDSX_FR_WRS - 1);
	ic->i_recv_ring_nr = min_t(u32, rdsx_recv_wr, dev->attrs.max_qp_wr - 1);
	ic->i_max_sge = min_t(int, dev->attrs.max_send_sge, RDSX_MAX_SGE);
	spin_lock_init(&ic->i_frmr_lock);
	INIT_LIST_HEAD(&ic->i_frmr_free);
	init_waitqueue_head(&ic->i_fastreg_wait);

	ic->i_pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(ic->i_pd))
		return PTR_ERR(ic->i_pd);
	ic->i_send_cq = ib_alloc_cq(dev, ic, ic->i_send_ring_nr + RDSX_FR_WRS + 1,
				    0, IB_POLL_SOFTIRQ);
	ic->i_recv_cq = ib_alloc_cq(dev, ic, ic->i_recv_ring_nr, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(ic->i_send_cq) || IS_ERR(ic->i_recv_cq)) {
		ret = -ENOMEM;
		goto err_pd;
	}

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = ic;
	/* OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- REG/INV are budgeted by i_fastreg_wrs, every other post by i_sq_free, plus one for the drain */
	attr.cap.max_send_wr = ic->i_send_ring_nr + RDSX_FR_WRS + 1;
	attr.cap.max_recv_wr = ic->i_recv_ring_nr + 1;
	attr.cap.max_send_sge = ic->i_max_sge;
	attr.cap.max_recv_sge = RDSX_RECV_SGE;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = ic->i_send_cq;
	attr.recv_cq = ic->i_recv_cq;

	ret = rdma_create_qp(ic->i_cm_id, ic->i_pd, &attr);
	if (ret)
		goto err_pd;
	atomic_set(&ic->i_sq_free, ic->i_send_ring_nr);
	ic->i_unsignaled_wrs = rdsx_max_unsig_wrs;

	ret = rdsx_frmr_alloc_pool(ic);
	if (ret)
		goto err_qp;
	ret = rdsx_setup_mailbox(ic);
	if (ret)
		goto err_qp;
	return 0;

err_qp:
	rdma_destroy_qp(ic->i_cm_id);
err_pd:
	if (!IS_ERR(ic->i_send_cq))
		ib_free_cq(ic->i_send_cq);
	if (!IS_ERR(ic->i_recv_cq))
		ib_free_cq(ic->i_recv_cq);
	ib_dealloc_pd(ic->i_pd);
	return ret;
}

void rdsx_conn_shutdown(struct rdsx_conn *ic)
{
	int i;

	rdma_disconnect(ic->i_cm_id);
	ib_drain_qp(ic->i_cm_id->qp);
	for (i = 0; i < RDSX_FRMR_POOL; i++) {
		if (ic->i_frmrs[i])
			rdsx_frmr_release(ic->i_frmrs[i]);
		ic->i_frmrs[i] = NULL;
	}
	if (ic->i_mailbox) {
		ib_dma_unmap_sg(ic->i_cm_id->device, &ic->i_mailbox_sg, 1,
				DMA_FROM_DEVICE);
		kfree(ic->i_mailbox);
	}
	rdma_destroy_qp(ic->i_cm_id);
	ib_free_cq(ic->i_send_cq);
	ib_free_cq(ic->i_recv_cq);
	ib_dealloc_pd(ic->i_pd);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Reliable datagram sockets over InfiniBand");
