// SPDX-License-Identifier: GPL-2.0
/*
 * sc_rds_mrpool.c - reliable-datagram-socket style transport over IB/iWARP.
 *
 * Applications register memory for peer RDMA with a GET_MR socket option;
 * the transport serves those registrations from a per-connection pool of
 * FRWR MRs (overflow MRs are allocated when the pool is empty and destroyed
 * once the peer reports it is done with the key) and returns a cookie
 * holding the rkey; pool MRs are invalidated and go back to the pool.
 * RDMA READs that a socket issues land in local pages registered with an MR
 * from the QP's ib_mr_pool; single-page reads use the PD's DMA lkey. Large
 * receive fragments land in one "scatter receive" MR. A separate control QP
 * carries heartbeats.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak,
 *   rdma-rkey-reuse, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation,
 *   rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- not reviewed
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define RDSX_POOL_SIZE		128
#define RDSX_MR_MAX_PAGES	256
#define RDSX_READ_MRS		32
#define RDSX_SEND_WR		256
#define RDSX_RECV_WR		1024
#define RDSX_MAX_SGE		8
#define RDSX_CTRL_SEND_WR	2048
#define RDSX_FRAG_PAGES		16
#define RDSX_RDMA_READWRITE	0x1
#define RDSX_RDMA_ATOMIC	0x2

struct rdsx_ib_mr {
	struct list_head	list;
	struct rdsx_conn	*ic;
	struct ib_mr		*mr;
	struct scatterlist	*sg;
	bool			overflow;	/* not from the pool: destroyed after use */
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		cqe;
};

struct rdsx_rdma_op {			/* one socket-issued RDMA READ */
	struct scatterlist	*sg;
	int			nents;
	u64			raddr;
	u32			rkey, len;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	read_wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	struct rdsx_conn	*ic;
};

/* the peer tells us it finished with a key */
struct rdsx_rdma_done_msg { __be32 rkey; __be32 flags; };
struct rdsx_recv { struct ib_cqe cqe; struct rdsx_conn *ic; struct rdsx_rdma_done_msg *msg; };

struct rdsx_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp, *ctrl_qp;
	struct ib_cq		*cq;
	spinlock_t		pool_lock;
	struct list_head	pool_free, pool_busy;
	struct ib_send_wr	inv_wr;
	struct rdsx_ib_mr	*pool[RDSX_POOL_SIZE];
	struct ib_mr		*rx_frag_mr;
	struct scatterlist	rx_frag_sg[RDSX_FRAG_PAGES];
	struct ib_reg_wr	rx_reg_wr;
};

static void rdsx_reg_done(struct ib_cq *cq, struct ib_wc *wc) { }
static int rdsx_pool_create(struct rdsx_conn *ic)
{
	struct rdsx_ib_mr *ibmr;
	int i, j;

	INIT_LIST_HEAD(&ic->pool_free);
	INIT_LIST_HEAD(&ic->pool_busy);
	spin_lock_init(&ic->pool_lock);
	for (i = 0; i < RDSX_POOL_SIZE; i++) {
		ibmr = kzalloc(sizeof(*ibmr), GFP_KERNEL);
		if (!ibmr)
			goto out_unwind;
		ic->pool[i] = ibmr;
		ibmr->ic = ic;
		ibmr->mr = ib_alloc_mr(ic->pd, IB_MR_TYPE_MEM_REG, RDSX_MR_MAX_PAGES);
		if (IS_ERR(ibmr->mr)) {
			kfree(ibmr);
			goto out_unwind;
		}
		ibmr->sg = kcalloc(RDSX_MR_MAX_PAGES, sizeof(*ibmr->sg), GFP_KERNEL);
		if (!ibmr->sg)
			goto out_unwind; /* BUG: rdma-mr-leak -- the unwinding covers j < i only; pool[i]->mr is never deregistered */
		list_add_tail(&ibmr->list, &ic->pool_free);
	}
	return 0;

out_unwind:
	for (j = 0; j < i; j++) {
		ib_dereg_mr(ic->pool[j]->mr);
		kfree(ic->pool[j]->sg);
		kfree(ic->pool[j]);
	}
	return -ENOMEM;
}

static int rdsx_mr_access(unsigned int flags)
{
	int access = IB_ACCESS_REMOTE_READ;

	if (flags & RDSX_RDMA_READWRITE)
		access |= IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	if (flags & RDSX_RDMA_ATOMIC)
		access |= IB_ACCESS_REMOTE_ATOMIC;
	return access;
}

static int rdsx_post_reg(struct rdsx_ib_mr *ibmr, unsigned int flags)
{
	struct rdsx_conn *ic = ibmr->ic;
	u8 key = (u8)(ibmr->mr->rkey & 0xff);

	ib_update_fast_reg_key(ibmr->mr, ++key);
	memset(&ibmr->reg_wr, 0, sizeof(ibmr->reg_wr));
	ibmr->cqe.done = rdsx_reg_done;
	ibmr->reg_wr.wr.wr_cqe = &ibmr->cqe;
	ibmr->reg_wr.wr.opcode = IB_WR_REG_MR;
	ibmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	ibmr->reg_wr.mr = ibmr->mr;
	ibmr->reg_wr.key = ibmr->mr->rkey;
	/* OK: rdma-remote-access-overbroad -- the rkey is returned to the application in the cookie */
	ibmr->reg_wr.access = rdsx_mr_access(flags); /* BUG: rdma-access-flags-invalid -- an atomic-only registration gets REMOTE_ATOMIC without LOCAL_WRITE */
	return ib_post_send(ic->qp, &ibmr->reg_wr.wr, NULL);
}

static void rdsx_pool_add(struct rdsx_conn *ic, struct rdsx_ib_mr *ibmr, struct list_head *l)
{
	spin_lock(&ic->pool_lock);
	list_add_tail(&ibmr->list, l);
	spin_unlock(&ic->pool_lock);
}

/* GET_MR socket option: control path. */
int rdsx_get_mr(struct rdsx_conn *ic, struct scatterlist *sg, int nents,
		unsigned int flags, u64 *cookie)
{
	struct rdsx_ib_mr *ibmr;
	int n, ret;

	spin_lock(&ic->pool_lock);
	ibmr = list_first_entry_or_null(&ic->pool_free, struct rdsx_ib_mr, list);
	if (ibmr)
		list_del(&ibmr->list);
	spin_unlock(&ic->pool_lock);

	if (!ibmr) {
		ibmr = kzalloc(sizeof(*ibmr), GFP_KERNEL);
		if (!ibmr)
			return -ENOMEM;
		ibmr->ic = ic;
		ibmr->overflow = true;
		ibmr->mr = ib_alloc_mr(ic->pd, IB_MR_TYPE_MEM_REG, RDSX_MR_MAX_PAGES);
		if (IS_ERR(ibmr->mr)) {
			ret = PTR_ERR(ibmr->mr);
			kfree(ibmr);
			return ret;
		}
	}
	n = ib_map_mr_sg(ibmr->mr, sg, nents, NULL, PAGE_SIZE);
	ret = n < nents ? -EINVAL : rdsx_post_reg(ibmr, flags);
	if (ret) {
		if (ibmr->overflow) {
			ib_dereg_mr(ibmr->mr);
			kfree(ibmr);
		} else {
			rdsx_pool_add(ic, ibmr, &ic->pool_free);
		}
		return ret; /* OK: rdma-mr-leak -- the MR is destroyed or back in the pool */
	}
	rdsx_pool_add(ic, ibmr, &ic->pool_busy);
	*cookie = ((u64)ibmr->mr->iova << 32) | ibmr->mr->rkey;
	return 0;
}

/* Receive completion of an RDMA-done message: the peer is finished with a key. */
void rdsx_recv_rdma_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_recv *rx = container_of(wc->wr_cqe, struct rdsx_recv, cqe);
	struct rdsx_conn *ic = rx->ic;
	struct rdsx_ib_mr *ibmr, *found = NULL;
	u32 rkey;
	int ret;

	if (wc->status != IB_WC_SUCCESS)
		return;
	rkey = be32_to_cpu(rx->msg->rkey);
	spin_lock(&ic->pool_lock);
	list_for_each_entry(ibmr, &ic->pool_busy, list) {
		if (ibmr->mr->rkey == rkey) {
			found = ibmr;
			list_del(&ibmr->list);
			break;
		}
	}
	spin_unlock(&ic->pool_lock);
	if (!found)
		return;
	if (found->overflow) {
		ib_dereg_mr(found->mr); /* BUG: rdma-registration-in-datapath -- an overflow MR is destroyed in the completion handler, once per use */
		kfree(found);
		return;
	}
	memset(&ic->inv_wr, 0, sizeof(ic->inv_wr));
	ic->inv_wr.opcode = IB_WR_LOCAL_INV;
	ic->inv_wr.ex.invalidate_rkey = found->mr->rkey;
	ret = ib_post_send(ic->qp, &ic->inv_wr, NULL);
	/* a failed LOCAL_INV leaves the key live: park it until teardown */
	rdsx_pool_add(ic, found, ret ? &ic->pool_busy : &ic->pool_free);
}

static void rdsx_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_rdma_op *op = container_of(wc->wr_cqe, struct rdsx_rdma_op, cqe);
	struct rdsx_conn *ic = op->ic;

	if (op->mr) {
		ib_mr_pool_put(ic->qp, &ic->qp->rdma_mrs, op->mr); /* OK: rdma-registration-in-datapath -- returned to the QP's pool, not deregistered */
		op->mr = NULL;
	}
}

/* RDMA READ of a peer's MR into the socket's pages. */
int rdsx_rdma_read_into(struct rdsx_conn *ic, struct rdsx_rdma_op *op)
{
	struct ib_mr *mr;
	int n, ret;

	op->ic = ic;
	op->cqe.done = rdsx_read_done;
	op->read_wr.wr.opcode = IB_WR_RDMA_READ;
	op->read_wr.wr.wr_cqe = &op->cqe;
	op->read_wr.wr.send_flags = IB_SEND_SIGNALED;
	op->read_wr.wr.sg_list = &op->sge;
	op->read_wr.wr.num_sge = 1;
	op->read_wr.remote_addr = op->raddr;
	op->read_wr.rkey = op->rkey;
	op->sge.length = op->len;

	if (op->nents == 1) {
		op->sge.addr = sg_dma_address(op->sg);
		op->sge.lkey = ic->pd->local_dma_lkey;
		return ib_post_send(ic->qp, &op->read_wr.wr, NULL); /* BUG: rdma-access-flags-transport -- a READ sink addressed with local_dma_lkey cannot take iWARP READ responses */
	}

	mr = ib_mr_pool_get(ic->qp, &ic->qp->rdma_mrs); /* OK: rdma-registration-in-datapath -- taken from a pool filled at setup */
	if (!mr)
		return -EAGAIN;
	n = ib_map_mr_sg(mr, op->sg, op->nents, NULL, PAGE_SIZE);
	if (n < op->nents)
		return -EINVAL; /* BUG: rdma-mr-leak -- the pool MR is not put back */

	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	op->reg_wr.wr.opcode = IB_WR_REG_MR;
	op->reg_wr.wr.next = &op->read_wr.wr;
	op->reg_wr.mr = mr;
	op->reg_wr.key = mr->rkey;
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE is what an iWARP READ sink needs */
	op->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- LOCAL_WRITE is present */
	op->sge.addr = mr->iova;
	op->sge.lkey = mr->lkey;
	ret = ib_post_send(ic->qp, &op->reg_wr.wr, NULL); /* OK: rdma-access-flags-transport -- the sink is registered with REMOTE_WRITE on every device */
	if (ret) {
		ib_mr_pool_put(ic->qp, &ic->qp->rdma_mrs, mr);
		return ret; /* OK: rdma-mr-leak -- the MR went back to the pool */
	}
	op->mr = mr;
	return 0;
}

static int rdsx_setup_rx_frag(struct rdsx_conn *ic)
{
	int n, ret;

	ic->rx_frag_mr = ib_alloc_mr(ic->pd, IB_MR_TYPE_MEM_REG, RDSX_FRAG_PAGES); /* OK: rdma-registration-in-datapath -- connection setup; the MR lives in the connection */
	if (IS_ERR(ic->rx_frag_mr))
		return PTR_ERR(ic->rx_frag_mr);
	n = ib_map_mr_sg(ic->rx_frag_mr, ic->rx_frag_sg, RDSX_FRAG_PAGES, NULL, PAGE_SIZE);
	if (n < RDSX_FRAG_PAGES) {
		ib_dereg_mr(ic->rx_frag_mr);
		return -EINVAL; /* OK: rdma-mr-leak -- released before returning */
	}
	ic->rx_reg_wr.wr.opcode = IB_WR_REG_MR;
	ic->rx_reg_wr.mr = ic->rx_frag_mr;
	ic->rx_reg_wr.key = ic->rx_frag_mr->rkey;
	/* BUG: rdma-remote-access-overbroad -- the scatter-receive MR only receives SENDs; its rkey never leaves the module */
	ic->rx_reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	ret = ib_post_send(ic->qp, &ic->rx_reg_wr.wr, NULL);
	if (ret)
		return ret; /* BUG: rdma-mr-leak -- rx_frag_mr stays registered and rdsx_conn_setup() frees the connection */
	return 0;
}

static int rdsx_setup_qp(struct rdsx_conn *ic)
{
	struct ib_device *dev = ic->dev;
	struct ib_qp_init_attr attr = {};

	attr.send_cq = attr.recv_cq = ic->cq;
	attr.cap.max_send_wr = min_t(u32, RDSX_SEND_WR, dev->attrs.max_qp_wr);
	attr.cap.max_recv_wr = RDSX_RECV_WR;
	attr.cap.max_send_sge = min_t(u32, RDSX_MAX_SGE, dev->attrs.max_send_sge); /* OK: rdma-queue-cap-unchecked -- limited by attrs.max_send_sge */
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	if (rdma_create_qp(ic->cm_id, ic->pd, &attr))
		return -ENOMEM;
	ic->qp = ic->cm_id->qp;
	return ib_mr_pool_init(ic->qp, &ic->qp->rdma_mrs, RDSX_READ_MRS,
			       IB_MR_TYPE_MEM_REG, RDSX_MR_MAX_PAGES, 0);
}

static void rdsx_pool_destroy(struct rdsx_conn *ic)
{
	struct rdsx_ib_mr *ibmr, *tmp;

	list_splice_init(&ic->pool_busy, &ic->pool_free);
	list_for_each_entry_safe(ibmr, tmp, &ic->pool_free, list) {
		list_del(&ibmr->list);
		ib_dereg_mr(ibmr->mr);
		kfree(ibmr->sg);
		kfree(ibmr);
	}
}

int rdsx_conn_setup(struct rdsx_conn *ic)
{
	int ret;

	ic->dev = ic->cm_id->device;
	ret = rdsx_setup_qp(ic);
	if (ret)
		goto out_free;
	ret = rdsx_pool_create(ic);
	if (ret)
		goto out_qp;
	ret = rdsx_setup_rx_frag(ic);
	if (ret)
		goto out_pool;
	return 0;

out_pool:
	rdsx_pool_destroy(ic);
out_qp:
	ib_mr_pool_destroy(ic->qp, &ic->qp->rdma_mrs);
	rdma_destroy_qp(ic->cm_id);
out_free:
	kfree(ic);
	return ret;
}

int rdsx_setup_ctrl_qp(struct rdsx_conn *ic, struct rdma_cm_id *ctrl_id)
{
	struct ib_qp_init_attr attr = {};

	attr.send_cq = attr.recv_cq = ic->cq;
	attr.cap.max_send_wr = RDSX_CTRL_SEND_WR; /* BUG: rdma-queue-cap-unchecked -- 2048 heartbeat WRs without looking at attrs.max_qp_wr */
	attr.cap.max_recv_wr = 64;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IB_QPT_RC;
	if (rdma_create_qp(ctrl_id, ic->pd, &attr))
		return -ENOMEM;
	ic->ctrl_qp = ctrl_id->qp;
	return 0;
}

void rdsx_conn_destroy(struct rdsx_conn *ic)
{
	ib_drain_qp(ic->qp);
	ib_dereg_mr(ic->rx_frag_mr);
	rdsx_pool_destroy(ic);
	ib_mr_pool_destroy(ic->qp, &ic->qp->rdma_mrs);
	rdma_destroy_qp(ic->cm_id);
	kfree(ic);
}

MODULE_LICENSE("GPL");
