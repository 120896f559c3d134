// SPDX-License-Identifier: GPL-2.0
/*
 * rdsx: reliable datagram sockets over InfiniBand and RoCE -- device
 * setup, connection QP setup, the fast-registration MR pool and the
 * RDMA operation path.
 *
 * Every device keeps a pool of FRWR MRs. User MRs (RDSX_GET_MR) take an MR
 * from the pool, register it with a fresh key (remap_count) and hand the
 * rkey back to the application in its cookie. REG_MR and LOCAL_INV share
 * the send queue with data sends but are admitted through their own
 * credit counter (i_fastreg_wrs), which has RDSX_FR_WRS entries reserved in
 * max_send_wr. Data sends are signaled every rdsx_max_unsig_wrs posts.
 * iWARP devices are refused at add time.
 *
 * Wrong: the "unsafe global rkey" module option exposes all of memory; the
 * atomic-only user MR asks for REMOTE_ATOMIC without LOCAL_WRITE; the
 * header ring is registered with REMOTE_READ although its rkey is never
 * sent; the congestion map re-registers a pool MR without a new key.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- lifetime checks are not the subject of this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <linux/unaligned.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDSX_FR_WRS		512
#define RDSX_RECV_SGE		2
#define RDSX_MAX_SGE		8
#define RDSX_FR_PAGES		64
#define RDSX_POOL_MRS		256
#define RDSX_HDR_SIZE		48

#define RDSX_RDMA_WRITABLE	0x1
#define RDSX_RDMA_ATOMIC	0x2

static bool rdsx_unsafe_global_rkey;
module_param(rdsx_unsafe_global_rkey, bool, 0444);
MODULE_PARM_DESC(rdsx_unsafe_global_rkey, "Use the PD's global rkey for RDMA to kernel buffers");

static unsigned int rdsx_max_unsig_wrs = 16;
module_param(rdsx_max_unsig_wrs, uint, 0644);

static unsigned int rdsx_send_wr = 256;
module_param(rdsx_send_wr, uint, 0444);

enum rdsx_frmr_state {
	FRMR_IS_FREE,
	FRMR_IS_INUSE,
	FRMR_IS_STALE,
};

struct rdsx_ib_conn;

struct rdsx_frmr {
	struct list_head	entry;
	struct ib_mr		*mr;
	struct ib_cqe		cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	enum rdsx_frmr_state	state;
	u8			remap_count;
	struct scatterlist	*sg;
	int			sg_dma_len;
	struct rdsx_ib_conn	*ic;
	struct completion	comp;
};

struct rdsx_device {
	struct list_head	list;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			max_wrs;
	u32			max_sge;
	spinlock_t		frmr_lock;
	struct list_head	frmr_free;
	struct rdsx_frmr	*frmrs;
	unsigned int		nr_frmrs;
};

struct rdsx_ring {
	u32	w_nr;
	u32	w_alloc_ptr;
	u32	w_free_ctr;
	atomic_t w_free;
};

struct rdsx_send_work {
	struct ib_cqe		s_cqe;
	struct ib_rdma_wr	s_rdma_wr;
	struct ib_sge		s_sge[RDSX_MAX_SGE];
};

struct rdsx_ib_conn {
	struct rdma_cm_id	*i_cm_id;
	struct ib_pd		*i_pd;
	struct ib_cq		*i_send_cq;
	struct ib_cq		*i_recv_cq;
	struct rdsx_device	*rdev;
	struct rdsx_ring	i_send_ring;
	struct rdsx_ring	i_recv_ring;
	struct rdsx_send_work	*i_sends;
	atomic_t		i_fastreg_wrs;
	unsigned int		i_unsignaled_wrs;

	void			*i_hdrs;
	struct scatterlist	i_hdr_sg;
	struct ib_mr		*i_hdr_mr;
	struct ib_cqe		i_hdr_cqe;
	struct ib_reg_wr	i_hdr_reg;
	struct completion	i_hdr_done;

	struct rdsx_frmr	*i_cong_frmr;
	struct scatterlist	*i_cong_sg;
	int			i_cong_nents;
	u32			i_cong_rkey;
};

struct rdsx_handshake {
	__le32	hs_cong_rkey;
	__le64	hs_cong_addr;
	__le32	hs_global_rkey;
};

static LIST_HEAD(rdsx_devices);

static void rdsx_frmr_done(struct ib_cq *cq, struct ib_wc *wc);

/* rdsx_send.c: first message on a new connection */
int rdsx_send_handshake(struct rdma_cm_id *cm_id, const struct rdsx_handshake *hs);

static int rdsx_frmr_pool_init(struct rdsx_device *rdev)
{
	int i;

	rdev->frmrs = kcalloc(rdev->nr_frmrs, sizeof(*rdev->frmrs), GFP_KERNEL);
	if (!rdev->frmrs)
		return -ENOMEM;

	for (i = 0; i < rdev->nr_frmrs; i++) {
		struct rdsx_frmr *frmr = &rdev->frmrs[i];

		// OK: rdma-registration-in-datapath -- the whole pool is allocated once when the device is added
		frmr->mr = ib_alloc_mr(rdev->pd, IB_MR_TYPE_MEM_REG,
				       RDSX_FR_PAGES);
		if (IS_ERR(frmr->mr))
			goto out_unwind;
		frmr->state = FRMR_IS_FREE;
		frmr->cqe.done = rdsx_frmr_done;
		init_completion(&frmr->comp);
		list_add_tail(&frmr->entry, &rdev->frmr_free);
	}
	return 0;

out_unwind:
	while (i--)
		ib_dereg_mr(rdev->frmrs[i].mr);
	kfree(rdev->frmrs);
	return -ENOMEM;
}

static void rdsx_frmr_pool_destroy(struct rdsx_device *rdev)
{
	int i;

	for (i = 0; i < rdev->nr_frmrs; i++)
		ib_dereg_mr(rdev->frmrs[i].mr);	// OK: rdma-registration-in-datapath -- pool teardown when the device goes away
	kfree(rdev->frmrs);
}

static struct rdsx_frmr *rdsx_frmr_get(struct rdsx_device *rdev)
{
	struct rdsx_frmr *frmr = NULL;

	spin_lock(&rdev->frmr_lock);
	if (!list_empty(&rdev->frmr_free)) {
		frmr = list_first_entry(&rdev->frmr_free, struct rdsx_frmr,
					entry);
		list_del_init(&frmr->entry);
	}
	spin_unlock(&rdev->frmr_lock);
	return frmr;
}

static int rdsx_add_one(struct ib_device *device)
{
	struct rdsx_device *rdev;
	unsigned int pd_flags = 0;
	int ret;

	/* RDS does not run over iWARP */
	if (rdma_protocol_iwarp(device, 1))
		return -EOPNOTSUPP;

	rdev = kzalloc(sizeof(*rdev), GFP_KERNEL);
	if (!rdev)
		return -ENOMEM;
	rdev->dev = device;
	rdev->max_wrs = device->attrs.max_qp_wr;
	rdev->max_sge = min_t(u32, device->attrs.max_send_sge, RDSX_MAX_SGE);
	rdev->nr_frmrs = RDSX_POOL_MRS;
	spin_lock_init(&rdev->frmr_lock);
	INIT_LIST_HEAD(&rdev->frmr_free);

	if (rdsx_unsafe_global_rkey)
		pd_flags |= IB_PD_UNSAFE_GLOBAL_RKEY;
	rdev->pd = ib_alloc_pd(device, pd_flags);	// BUG: rdma-remote-access-overbroad -- with the module option every peer that learns the PD's global rkey can read and write all kernel memory
	if (IS_ERR(rdev->pd)) {
		ret = PTR_ERR(rdev->pd);
		goto out_free;
	}

	ret = rdsx_frmr_pool_init(rdev);
	if (ret)
		goto out_pd;
	list_add_tail(&rdev->list, &rdsx_devices);
	return 0;

out_pd:
	ib_dealloc_pd(rdev->pd);
out_free:
	kfree(rdev);
	return ret;
}

static void rdsx_remove_one(struct rdsx_device *rdev)
{
	list_del(&rdev->list);
	rdsx_frmr_pool_destroy(rdev);
	ib_dealloc_pd(rdev->pd);
	kfree(rdev);
}

static void rdsx_ring_resize(struct rdsx_ring *ring, u32 nr)
{
	ring->w_nr = nr;
	atomic_set(&ring->w_free, nr);
}

static void rdsx_hdr_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_ib_conn *ic =
		container_of(wc->wr_cqe, struct rdsx_ib_conn, i_hdr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		pr_err("rdsx: header ring registration failed\n");
	complete(&ic->i_hdr_done);
}

/* The header ring lives as long as the connection. */
static int rdsx_reg_hdr_ring(struct rdsx_ib_conn *ic)
{
	struct ib_device *dev = ic->rdev->dev;
	size_t len = ic->i_send_ring.w_nr * RDSX_HDR_SIZE;
	int nents, ret;

	ic->i_hdrs = kzalloc(len, GFP_KERNEL);
	if (!ic->i_hdrs)
		return -ENOMEM;
	sg_init_one(&ic->i_hdr_sg, ic->i_hdrs, len);
	nents = ib_dma_map_sg(dev, &ic->i_hdr_sg, 1, DMA_BIDIRECTIONAL);
	if (!nents) {
		ret = -EIO;
		goto out_free;
	}

	// OK: rdma-registration-in-datapath -- once per connection, when it is established
	ic->i_hdr_mr = ib_alloc_mr(ic->i_pd, IB_MR_TYPE_MEM_REG,
				   DIV_ROUND_UP(len, PAGE_SIZE) + 1);
	if (IS_ERR(ic->i_hdr_mr)) {
		ret = PTR_ERR(ic->i_hdr_mr);
		goto out_unmap;
	}
	ret = ib_map_mr_sg(ic->i_hdr_mr, &ic->i_hdr_sg, 1, NULL, PAGE_SIZE);
	if (ret != 1) {
		ret = -EINVAL;
		goto out_dereg;
	}

	ic->i_hdr_cqe.done = rdsx_hdr_reg_done;
	ic->i_hdr_reg.wr.opcode = IB_WR_REG_MR;
	ic->i_hdr_reg.wr.wr_cqe = &ic->i_hdr_cqe;
	ic->i_hdr_reg.wr.send_flags = IB_SEND_SIGNALED;
	ic->i_hdr_reg.wr.num_sge = 0;
	ic->i_hdr_reg.mr = ic->i_hdr_mr;	// OK: rdma-rkey-reuse -- the MR was allocated just above and is registered once for the connection's lifetime
	ic->i_hdr_reg.key = ic->i_hdr_mr->rkey;
	/* lets the peer pull oversized headers with RDMA READ */
	ic->i_hdr_reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;	// BUG: rdma-remote-access-overbroad -- the header ring's rkey is never sent to the peer; only its lkey is used

	init_completion(&ic->i_hdr_done);
	ret = ib_post_send(ic->i_cm_id->qp, &ic->i_hdr_reg.wr, NULL);
	if (ret)
		goto out_dereg;
	wait_for_completion(&ic->i_hdr_done);
	return 0;

out_dereg:
	ib_dereg_mr(ic->i_hdr_mr);
out_unmap:
	ib_dma_unmap_sg(dev, &ic->i_hdr_sg, 1, DMA_BIDIRECTIONAL);
out_free:
	kfree(ic->i_hdrs);
	return ret;
}

/* Header SGE of send ring slot @pos, for the send path. */
void rdsx_hdr_sge(struct rdsx_ib_conn *ic, u32 pos, struct ib_sge *sge)
{
	sge->addr = ic->i_hdr_mr->iova + pos * RDSX_HDR_SIZE;
	sge->length = RDSX_HDR_SIZE;
	sge->lkey = ic->i_hdr_mr->lkey;
}

static int rdsx_setup_qp(struct rdsx_ib_conn *ic)
{
	struct rdsx_device *rdev = ic->rdev;
	struct ib_qp_init_attr attr = { };
	int ret;

	ic->i_pd = rdev->pd;
	ic->i_send_ring.w_nr = rdsx_send_wr;
	ic->i_recv_ring.w_nr = rdsx_send_wr;

	// OK: rdma-queue-cap-unchecked -- the rings are shrunk to what max_qp_wr allows, fast-reg reserve included
	if (rdev->max_wrs < ic->i_send_ring.w_nr + RDSX_FR_WRS + 1)
		rdsx_ring_resize(&ic->i_send_ring,
				 rdev->max_wrs - RDSX_FR_WRS - 1);
	if (rdev->max_wrs < ic->i_recv_ring.w_nr + 1)
		rdsx_ring_resize(&ic->i_recv_ring, rdev->max_wrs - 1);

	ic->i_send_cq = ib_alloc_cq(rdev->dev, ic, ic->i_send_ring.w_nr +
				    RDSX_FR_WRS + 1, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(ic->i_send_cq))
		return PTR_ERR(ic->i_send_cq);
	ic->i_recv_cq = ib_alloc_cq(rdev->dev, ic, ic->i_recv_ring.w_nr, 0,
				    IB_POLL_SOFTIRQ);
	if (IS_ERR(ic->i_recv_cq)) {
		ret = PTR_ERR(ic->i_recv_cq);
		goto out_scq;
	}

	attr.qp_context = ic;
	/* send ring entries, fast-reg/invalidate reserve, +1 for drain */
	// OK: rdma-send-queue-undersized -- each ring slot is one work request and REG_MR/LOCAL_INV only run against the i_fastreg_wrs credits reserved here
	attr.cap.max_send_wr = ic->i_send_ring.w_nr + RDSX_FR_WRS + 1;	// OK: rdma-send-queue-manual-factor -- a fixed reserve added once, not a factor on the depth
	attr.cap.max_recv_wr = ic->i_recv_ring.w_nr + 1;
	attr.cap.max_send_sge = rdev->max_sge;	// OK: rdma-queue-cap-unchecked -- clamped to attrs.max_send_sge in rdsx_add_one()
	attr.cap.max_recv_sge = RDSX_RECV_SGE;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = ic->i_send_cq;
	attr.recv_cq = ic->i_recv_cq;
	atomic_set(&ic->i_fastreg_wrs, RDSX_FR_WRS);

	ret = rdma_create_qp(ic->i_cm_id, ic->i_pd, &attr);
	if (ret)
		goto out_rcq;
	return 0;

out_rcq:
	ib_free_cq(ic->i_recv_cq);
out_scq:
	ib_free_cq(ic->i_send_cq);
	return ret;
}

static void rdsx_frmr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_frmr *frmr = container_of(wc->wr_cqe, struct rdsx_frmr, cqe);
	struct rdsx_ib_conn *ic = frmr->ic;
	struct rdsx_device *rdev = ic->rdev;

	if (wc->status != IB_WC_SUCCESS) {
		frmr->state = FRMR_IS_STALE;
		pr_err("rdsx: fastreg/inv failed: %s\n",
		       ib_wc_status_msg(wc->status));
	}

	if (wc->opcode == IB_WC_LOCAL_INV && frmr->state != FRMR_IS_STALE) {
		ib_dma_unmap_sg(rdev->dev, frmr->sg, frmr->sg_dma_len,
				DMA_BIDIRECTIONAL);
		frmr->state = FRMR_IS_FREE;
		spin_lock(&rdev->frmr_lock);
		list_add_tail(&frmr->entry, &rdev->frmr_free);
		spin_unlock(&rdev->frmr_lock);
	}
	atomic_inc(&ic->i_fastreg_wrs);
	complete(&frmr->comp);
}

static int rdsx_post_reg_frmr(struct rdsx_ib_conn *ic, struct rdsx_frmr *frmr,
			      u32 rflags)
{
	int access, n, ret;

	if (atomic_dec_return(&ic->i_fastreg_wrs) < 0) {
		atomic_inc(&ic->i_fastreg_wrs);
		return -EBUSY;
	}

	n = ib_map_mr_sg(frmr->mr, frmr->sg, frmr->sg_dma_len, NULL, PAGE_SIZE);
	if (unlikely(n != frmr->sg_dma_len)) {
		ret = n < 0 ? n : -EINVAL;
		goto out_inc;
	}

	access = IB_ACCESS_REMOTE_READ;
	if (rflags & RDSX_RDMA_WRITABLE)
		access |= IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	if (rflags & RDSX_RDMA_ATOMIC)
		access |= IB_ACCESS_REMOTE_ATOMIC;

	ib_update_fast_reg_key(frmr->mr, frmr->remap_count++);
	frmr->ic = ic;
	frmr->state = FRMR_IS_INUSE;
	memset(&frmr->reg_wr, 0, sizeof(frmr->reg_wr));
	frmr->reg_wr.wr.wr_cqe = &frmr->cqe;
	frmr->reg_wr.wr.opcode = IB_WR_REG_MR;
	frmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	frmr->reg_wr.mr = frmr->mr;	// OK: rdma-rkey-reuse -- remap_count gives every registration of the pooled MR a new key byte
	frmr->reg_wr.key = frmr->mr->rkey;
	// OK: rdma-remote-access-overbroad -- the key goes back to the application's cookie in rdsx_get_mr()
	frmr->reg_wr.access = access;	// BUG: rdma-access-flags-invalid -- an atomic-only MR (RDSX_RDMA_ATOMIC without RDSX_RDMA_WRITABLE) gets REMOTE_ATOMIC without LOCAL_WRITE

	reinit_completion(&frmr->comp);
	ret = ib_post_send(ic->i_cm_id->qp, &frmr->reg_wr.wr, NULL);
	if (ret) {
		frmr->state = FRMR_IS_STALE;
		goto out_inc;
	}
	return 0;

out_inc:
	atomic_inc(&ic->i_fastreg_wrs);
	return ret;
}

/* RDSX_GET_MR: register user pages, return the rkey for the cookie. */
int rdsx_get_mr(struct rdsx_ib_conn *ic, struct scatterlist *sg, int nents,
		u32 rflags, u32 *key_ret)
{
	struct rdsx_frmr *frmr;
	int ret;

	frmr = rdsx_frmr_get(ic->rdev);
	if (!frmr)
		return -EAGAIN;

	frmr->sg = sg;
	frmr->sg_dma_len = ib_dma_map_sg(ic->rdev->dev, sg, nents,
					 DMA_BIDIRECTIONAL);
	if (!frmr->sg_dma_len) {
		ret = -EFAULT;
		goto out_put;
	}
	ret = rdsx_post_reg_frmr(ic, frmr, rflags);
	if (ret)
		goto out_unmap;
	wait_for_completion(&frmr->comp);
	if (frmr->state != FRMR_IS_INUSE)
		return -EIO;

	*key_ret = frmr->mr->rkey;
	return 0;

out_unmap:
	ib_dma_unmap_sg(ic->rdev->dev, sg, nents, DMA_BIDIRECTIONAL);
out_put:
	spin_lock(&ic->rdev->frmr_lock);
	list_add(&frmr->entry, &ic->rdev->frmr_free);
	spin_unlock(&ic->rdev->frmr_lock);
	return ret;
}

/* RDSX_FREE_MR: kill the key; the MR returns to the pool on completion. */
int rdsx_free_mr(struct rdsx_ib_conn *ic, struct rdsx_frmr *frmr)
{
	int ret;

	if (atomic_dec_return(&ic->i_fastreg_wrs) < 0) {
		atomic_inc(&ic->i_fastreg_wrs);
		return -EBUSY;
	}

	memset(&frmr->inv_wr, 0, sizeof(frmr->inv_wr));
	frmr->inv_wr.wr_cqe = &frmr->cqe;
	frmr->inv_wr.opcode = IB_WR_LOCAL_INV;
	frmr->inv_wr.ex.invalidate_rkey = frmr->mr->rkey;
	frmr->inv_wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(ic->i_cm_id->qp, &frmr->inv_wr, NULL);
	if (ret) {
		frmr->state = FRMR_IS_STALE;
		atomic_inc(&ic->i_fastreg_wrs);
	}
	return ret;
}

/* Register the connection's congestion map so the peer can set its bits. */
static int rdsx_cong_map_register(struct rdsx_ib_conn *ic,
				  struct rdsx_handshake *hs)
{
	struct rdsx_frmr *frmr;
	int n;

	frmr = rdsx_frmr_get(ic->rdev);
	if (!frmr)
		return -EAGAIN;
	frmr->ic = ic;
	frmr->sg = ic->i_cong_sg;
	frmr->sg_dma_len = ib_dma_map_sg(ic->rdev->dev, ic->i_cong_sg,
					 ic->i_cong_nents, DMA_BIDIRECTIONAL);
	n = ib_map_mr_sg(frmr->mr, frmr->sg, frmr->sg_dma_len, NULL, PAGE_SIZE);
	if (n != frmr->sg_dma_len)
		return -EINVAL;

	frmr->state = FRMR_IS_INUSE;
	frmr->reg_wr.wr.next = NULL;
	frmr->reg_wr.wr.wr_cqe = &frmr->cqe;
	frmr->reg_wr.wr.opcode = IB_WR_REG_MR;
	frmr->reg_wr.wr.num_sge = 0;
	frmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	frmr->reg_wr.mr = frmr->mr;	// BUG: rdma-rkey-reuse -- a pooled MR (invalidated and freed by rdsx_frmr_done) is registered again with the key its last user's peer already knows
	frmr->reg_wr.key = frmr->mr->rkey;
	frmr->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;	// OK: rdma-access-flags-invalid -- remote write comes with local write

	ic->i_cong_frmr = frmr;
	ic->i_cong_rkey = frmr->mr->rkey;
	// OK: rdma-remote-access-overbroad -- the congestion map's rkey goes to the peer in the handshake message
	put_unaligned_le32(ic->i_cong_rkey, &hs->hs_cong_rkey);
	put_unaligned_le64(frmr->mr->iova, &hs->hs_cong_addr);

	atomic_dec(&ic->i_fastreg_wrs);
	return ib_post_send(ic->i_cm_id->qp, &frmr->reg_wr.wr, NULL);
}

static void rdsx_fill_handshake(struct rdsx_ib_conn *ic, struct rdsx_handshake *hs)
{
	memset(hs, 0, sizeof(*hs));
	if (rdsx_cong_map_register(ic, hs))
		pr_warn("rdsx: congestion map not registered\n");
	if (rdsx_unsafe_global_rkey)
		put_unaligned_le32(ic->i_pd->unsafe_global_rkey,
				   &hs->hs_global_rkey);
}

static int rdsx_set_wr_signal_state(struct rdsx_ib_conn *ic,
				    struct rdsx_send_work *send, bool notify)
{
	// OK: rdma-unsignaled-send-starvation -- the countdown moves on every unsignaled post and is reloaded when it signals
	if (ic->i_unsignaled_wrs-- == 0 || notify) {
		ic->i_unsignaled_wrs = rdsx_max_unsig_wrs;
		send->s_rdma_wr.wr.send_flags |= IB_SEND_SIGNALED;
		return 1;
	}
	return 0;
}

/* Post an RDMA READ or WRITE between kernel pages and the peer's MR. */
int rdsx_xmit_rdma(struct rdsx_ib_conn *ic, struct scatterlist *sg, int nents,
		   bool is_write, u64 remote_addr, u32 rkey, u32 pos)
{
	struct rdsx_send_work *send, *first = NULL, *prev = NULL;
	struct scatterlist *s;
	int i = 0, j, sent = 0, num_sge, ret;

	nents = ib_dma_map_sg(ic->rdev->dev, sg, nents,
			      is_write ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	if (!nents)
		return -EIO;

	s = sg;
	while (i < nents) {
		send = &ic->i_sends[pos];
		num_sge = min_t(int, nents - i, ic->rdev->max_sge);

		memset(&send->s_rdma_wr, 0, sizeof(send->s_rdma_wr));
		send->s_rdma_wr.wr.opcode = is_write ? IB_WR_RDMA_WRITE :
						       IB_WR_RDMA_READ;
		send->s_rdma_wr.wr.wr_cqe = &send->s_cqe;
		send->s_rdma_wr.wr.sg_list = send->s_sge;
		send->s_rdma_wr.wr.num_sge = num_sge;
		send->s_rdma_wr.remote_addr = remote_addr;
		send->s_rdma_wr.rkey = rkey;

		for (j = 0; j < num_sge; j++, i++, s = sg_next(s)) {
			send->s_sge[j].addr = sg_dma_address(s);
			send->s_sge[j].length = sg_dma_len(s);
			// OK: rdma-access-flags-transport -- rdsx_add_one() refuses iWARP devices, so a READ sink needs no remote rights
			send->s_sge[j].lkey = ic->i_pd->local_dma_lkey;
			remote_addr += sg_dma_len(s);
		}

		rdsx_set_wr_signal_state(ic, send, i == nents);
		if (prev)
			prev->s_rdma_wr.wr.next = &send->s_rdma_wr.wr;
		else
			first = send;
		prev = send;
		sent++;
		if (++pos == ic->i_send_ring.w_nr)
			pos = 0;
	}

	ret = ib_post_send(ic->i_cm_id->qp, &first->s_rdma_wr.wr, NULL);
	return ret ? ret : sent;
}

int rdsx_conn_connect(struct rdsx_ib_conn *ic)
{
	return rdsx_setup_qp(ic);
}

/* RDMA_CM_EVENT_ESTABLISHED: the QP can post now. */
int rdsx_conn_established(struct rdsx_ib_conn *ic, struct rdsx_handshake *hs)
{
	int ret;

	ret = rdsx_reg_hdr_ring(ic);
	if (ret)
		return ret;
	rdsx_fill_handshake(ic, hs);
	return rdsx_send_handshake(ic->i_cm_id, hs);
}

void rdsx_conn_shutdown(struct rdsx_ib_conn *ic)
{
	rdma_disconnect(ic->i_cm_id);
	ib_drain_qp(ic->i_cm_id->qp);
	rdma_destroy_qp(ic->i_cm_id);
	ib_free_cq(ic->i_recv_cq);
	ib_free_cq(ic->i_send_cq);
}

struct rdsx_ib_client {
	const char	*name;
	int		(*add)(struct ib_device *device);
	void		(*remove)(struct rdsx_device *rdev);
};

struct rdsx_ib_client rdsx_client = {
	.name	= "rdsx",
	.add	= rdsx_add_one,
	.remove	= rdsx_remove_one,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("rdsx reliable datagram sockets over RDMA");
