// SPDX-License-Identifier: GPL-2.0-only
/*
 * rb_dlm_lowcomms.c - distributed lock manager transport over RDMA.
 *
 * One RC connection per cluster node, made of two QPs: the lock QP carries
 * lock requests, grants, ASTs and recovery messages; the control QP carries
 * heartbeats and sequence acknowledgements.  All messages are small and are
 * posted inline.  Both QPs signal selectively: a send is signaled once every
 * N sends and its completion retires the unsignaled ones before it.
 *
 * During recovery a node exports its resource directory dump: the buffer is
 * registered (REMOTE_READ) with the connection's dump MR and its key is sent
 * in a DUMP_READY message; the recovery master pulls it with RDMA READ and
 * answers DUMP_DONE, normally as SEND_WITH_INV of the dump key.  The dump MR
 * is allocated when the connection is set up and reused for every recovery.
 *
 * Known problems: the control QP's signaling counter is never advanced, the
 * DUMP_DONE handler trusts any remote invalidation, a dump timeout frees the
 * buffer while the master may still hold the key, and connection setup leaks
 * the dump MR when the send ring cannot be allocated.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-rkey-reuse,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad -- not reviewed in this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDL_SEND_RING		128
#define RDL_MSG_MAX		256
#define RDL_SIGNAL_INTERVAL	32
#define RDL_CTRL_BATCH		16
#define RDL_DUMP_PAGES		256
#define RDL_DUMP_TIMEOUT	(10 * HZ)

#ifndef cpu_to_le16
#define cpu_to_le16(x)		((__le16)(u16)(x))
#endif

enum {
	RDL_CMD_LOCK		= 1,
	RDL_CMD_DUMP_READY	= 7,
	RDL_CMD_DUMP_DONE	= 8,
	RDL_CTRL_HEARTBEAT	= 20,
	RDL_CTRL_ACK		= 21,
};

struct rdl_hdr {
	__le32	h_nodeid;
	__le16	h_length;
	u8	h_cmd;
	u8	h_pad;
	__le64	h_seq;
};

struct rdl_dump_desc {
	struct rdl_hdr	hdr;
	__le64		addr;
	__le32		rkey;
	__le32		len;
};

struct rdl_dump {
	void			*buf;
	size_t			len;
	struct scatterlist	sgl[1];
	int			nents;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	int			inv_status;
	struct completion	done;		/* DUMP_DONE received */
	bool			remote_invalidated;
};

struct rdl_con {
	int			nodeid;
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;		/* lock traffic */
	struct ib_qp		*ctrl_qp;	/* heartbeats, acks */

	spinlock_t		tx_lock;
	char			(*tx_ring)[RDL_MSG_MAX];
	u64			tx_ring_dma;
	unsigned int		tx_head;
	unsigned int		tx_unsignaled;
	unsigned int		ctrl_unsignaled;
	struct ib_cqe		tx_cqe;
	u64			seq_out;

	struct rdl_dump		dump;
};

int dlm_receive_buffer(int nodeid, struct rdl_hdr *hdr);
void rdl_con_schedule_reconnect(struct rdl_con *con);

static void rdl_tx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdl_con *con = container_of(wc->wr_cqe, struct rdl_con, tx_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR) {
		pr_err("dlm: send to node %d failed: %s\n", con->nodeid,
		       ib_wc_status_msg(wc->status));
		rdl_con_schedule_reconnect(con);
	}
}

/* Lock QP: copy into the ring, post inline, signal every Nth send. */
int rdl_send_msg(struct rdl_con *con, const void *msg, u32 len, bool flush)
{
	struct ib_send_wr wr;
	struct ib_sge sge;
	unsigned int slot;
	int ret;

	if (len > RDL_MSG_MAX)
		return -EMSGSIZE;

	spin_lock(&con->tx_lock);
	slot = con->tx_head++ % RDL_SEND_RING;
	memcpy(con->tx_ring[slot], msg, len);

	sge.addr = con->tx_ring_dma + slot * RDL_MSG_MAX;
	sge.length = len;
	sge.lkey = con->pd->local_dma_lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_cqe = &con->tx_cqe;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IB_SEND_INLINE;
	if (++con->tx_unsignaled >= RDL_SIGNAL_INTERVAL || flush) {
		wr.send_flags |= IB_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- tx_unsignaled goes up on every send and is reset here */
		con->tx_unsignaled = 0;
	}
	ret = ib_post_send(con->qp, &wr, NULL);
	spin_unlock(&con->tx_lock);
	return ret;
}

/* Control QP: heartbeats and sequence acks. */
static int rdl_ctrl_post(struct rdl_con *con, u8 cmd, u64 seq)
{
	struct rdl_hdr hdr;
	struct ib_send_wr wr;
	struct ib_sge sge;

	memset(&hdr, 0, sizeof(hdr));
	hdr.h_nodeid = cpu_to_le32(con->nodeid);
	hdr.h_length = cpu_to_le16(sizeof(hdr));
	hdr.h_cmd = cmd;
	hdr.h_seq = cpu_to_le64(seq);

	sge.addr = (uintptr_t)&hdr;	/* inline: copied at post time */
	sge.length = sizeof(hdr);
	sge.lkey = 0;

	memset(&wr, 0, sizeof(wr));
	wr.wr_cqe = &con->tx_cqe;
	wr.opcode = IB_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IB_SEND_INLINE;
	if (con->ctrl_unsignaled >= RDL_CTRL_BATCH) { /* BUG(file): rdma-unsignaled-send-starvation -- ctrl_unsignaled is only ever reset, never incremented: the control QP never gets a signaled send */
		wr.send_flags |= IB_SEND_SIGNALED;
		con->ctrl_unsignaled = 0;
	}
	return ib_post_send(con->ctrl_qp, &wr, NULL);
}

int rdl_send_heartbeat(struct rdl_con *con)
{
	return rdl_ctrl_post(con, RDL_CTRL_HEARTBEAT, 0);
}

int rdl_send_ack(struct rdl_con *con, u64 seq)
{
	return rdl_ctrl_post(con, RDL_CTRL_ACK, seq);
}

/* ------------------------------------------------------ directory dump */

static void rdl_dump_free_buf(struct rdl_con *con)
{
	struct rdl_dump *d = &con->dump;

	if (d->nents)
		ib_dma_unmap_sg(con->dev, d->sgl, 1, DMA_TO_DEVICE);
	d->nents = 0;
	kfree(d->buf);
	d->buf = NULL;
}

int rdl_dump_export(struct rdl_con *con, void *buf, size_t len)
{
	struct rdl_dump *d = &con->dump;
	struct rdl_dump_desc desc;
	struct ib_mr *mr;
	int n, ret;

	if (!d->mr) {
		mr = ib_alloc_mr(con->pd, IB_MR_TYPE_MEM_REG, RDL_DUMP_PAGES);
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		d->mr = mr;
	}

	d->buf = buf;
	d->len = len;
	d->remote_invalidated = false;
	init_completion(&d->done);
	sg_init_one(d->sgl, buf, len);
	d->nents = ib_dma_map_sg(con->dev, d->sgl, 1, DMA_TO_DEVICE);
	if (!d->nents)
		return -EIO;

	n = ib_map_mr_sg(d->mr, d->sgl, d->nents, NULL, PAGE_SIZE);
	if (n != d->nents) {
		ret = -EIO;
		goto out_unmap;
	}
	ib_update_fast_reg_key(d->mr, ib_inc_rkey(d->mr->rkey));

	memset(&d->reg_wr, 0, sizeof(d->reg_wr));
	d->reg_wr.wr.opcode = IB_WR_REG_MR;
	d->reg_wr.wr.wr_cqe = &con->tx_cqe;
	d->reg_wr.mr = d->mr;
	d->reg_wr.key = d->mr->rkey;
	d->reg_wr.access = IB_ACCESS_REMOTE_READ;
	ret = ib_post_send(con->qp, &d->reg_wr.wr, NULL);
	if (ret)
		goto out_unmap;

	memset(&desc, 0, sizeof(desc));
	desc.hdr.h_nodeid = cpu_to_le32(con->nodeid);
	desc.hdr.h_length = cpu_to_le16(sizeof(desc));
	desc.hdr.h_cmd = RDL_CMD_DUMP_READY;
	desc.addr = cpu_to_le64(d->mr->iova);
	desc.rkey = cpu_to_le32(d->mr->rkey);
	desc.len = cpu_to_le32((u32)len);
	ret = rdl_send_msg(con, &desc, sizeof(desc), true);
	if (ret) {
		/* registered but never announced: dereg kills the key */
		ib_dereg_mr(d->mr);
		d->mr = NULL;
		goto out_unmap;
	}
	return 0;

out_unmap:
	ib_dma_unmap_sg(con->dev, d->sgl, 1, DMA_TO_DEVICE); /* OK: rdma-invalidation-leak -- the REG_MR was not posted, or the MR was deregistered */
	d->nents = 0;
	d->buf = NULL;
	return ret;
}

static void rdl_dump_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdl_dump *d = container_of(wc->wr_cqe, struct rdl_dump, inv_cqe);

	d->inv_status = wc->status;
	complete(&d->inv_done);
}

static void rdl_dump_release(struct rdl_con *con)
{
	struct rdl_dump *d = &con->dump;
	int ret;

	if (!d->remote_invalidated) {
		memset(&d->inv_wr, 0, sizeof(d->inv_wr));
		d->inv_cqe.done = rdl_dump_inv_done;
		d->inv_wr.wr_cqe = &d->inv_cqe;
		d->inv_wr.opcode = IB_WR_LOCAL_INV;
		d->inv_wr.send_flags = IB_SEND_SIGNALED;
		d->inv_wr.ex.invalidate_rkey = d->mr->rkey;
		init_completion(&d->inv_done);

		ret = ib_post_send(con->qp, &d->inv_wr, NULL);
		if (!ret) {
			wait_for_completion(&d->inv_done);
			if (d->inv_status != IB_WC_SUCCESS)
				ret = -EIO;
		}
		if (ret) {
			/* key state unknown: deregistering kills it */
			ib_dereg_mr(d->mr);
			d->mr = NULL;
		}
	}
	rdl_dump_free_buf(con); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV completed, or the MR was deregistered */
}

/* Recovery: export the directory to the master and wait for it to read it. */
int rdl_dump_to_master(struct rdl_con *con, void *buf, size_t len)
{
	struct rdl_dump *d = &con->dump;
	int ret;

	ret = rdl_dump_export(con, buf, len);
	if (ret)
		return ret;

	if (!wait_for_completion_timeout(&d->done, RDL_DUMP_TIMEOUT)) {
		pr_warn("dlm: node %d did not finish reading the dump\n",
			con->nodeid);
		rdl_dump_free_buf(con); /* BUG: rdma-invalidation-leak -- the master may still hold the dump key; the buffer is freed while it is valid */
		return -ETIMEDOUT;
	}
	rdl_dump_release(con);
	return 0;
}

static void rdl_handle_dump_done(struct rdl_con *con, struct ib_wc *wc)
{
	struct rdl_dump *d = &con->dump;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) /* BUG: rdma-remote-invalidate-unchecked -- wc->ex.invalidate_rkey is never compared with d->mr->rkey */
		d->remote_invalidated = true;
	complete(&d->done);
}

void rdl_recv_done(struct rdl_con *con, struct ib_wc *wc, struct rdl_hdr *hdr)
{
	if (wc->status != IB_WC_SUCCESS) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			rdl_con_schedule_reconnect(con);
		return;
	}
	if (hdr->h_cmd == RDL_CMD_DUMP_DONE) {
		rdl_handle_dump_done(con, wc);
		return;
	}
	if (unlikely(wc->wc_flags & IB_WC_WITH_INVALIDATE)) { /* OK: rdma-remote-invalidate-unchecked -- lock messages never invalidate; the message is dropped */
		pr_err("dlm: node %d sent cmd %u with invalidate, dropped\n",
		       con->nodeid, hdr->h_cmd);
		return;
	}
	dlm_receive_buffer(con->nodeid, hdr);
}

/* ------------------------------------------------------------- setup */

static int rdl_create_qp(struct rdl_con *con, struct ib_qp **qpp, int depth)
{
	struct ib_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = con;
	attr.send_cq = con->cq;
	attr.recv_cq = con->cq;
	attr.cap.max_send_wr = depth;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct rdl_dump_desc);
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	*qpp = ib_create_qp(con->pd, &attr);
	return IS_ERR(*qpp) ? PTR_ERR(*qpp) : 0;
}

int rdl_con_setup(struct rdl_con *con)
{
	struct ib_mr *mr;
	int ret;

	spin_lock_init(&con->tx_lock);
	con->tx_cqe.done = rdl_tx_done;
	con->tx_unsignaled = 0;
	con->ctrl_unsignaled = 0;

	ret = rdl_create_qp(con, &con->qp, RDL_SEND_RING + 8);
	if (ret)
		return ret;
	ret = rdl_create_qp(con, &con->ctrl_qp, 64);
	if (ret)
		goto out_qp;

	mr = ib_alloc_mr(con->pd, IB_MR_TYPE_MEM_REG, RDL_DUMP_PAGES);
	if (IS_ERR(mr)) {
		ret = PTR_ERR(mr);
		goto out_ctrl; /* OK: rdma-mr-leak -- the allocation failed */
	}
	con->dump.mr = mr;

	con->tx_ring = kcalloc(RDL_SEND_RING, RDL_MSG_MAX, GFP_KERNEL);
	if (!con->tx_ring) {
		ret = -ENOMEM;
		goto out_ctrl; /* BUG: rdma-mr-leak -- out_ctrl does not deregister con->dump.mr */
	}
	con->tx_ring_dma = ib_dma_map_single(con->dev, con->tx_ring,
					     RDL_SEND_RING * RDL_MSG_MAX,
					     DMA_TO_DEVICE);
	if (ib_dma_mapping_error(con->dev, con->tx_ring_dma)) {
		ret = -ENOMEM;
		goto out_ring; /* OK: rdma-mr-leak -- out_ring deregisters the dump MR */
	}
	return 0;

out_ring:
	kfree(con->tx_ring);
	con->tx_ring = NULL;
	ib_dereg_mr(con->dump.mr);
	con->dump.mr = NULL;
out_ctrl:
	ib_destroy_qp(con->ctrl_qp);
out_qp:
	ib_destroy_qp(con->qp);
	return ret;
}

void rdl_con_close(struct rdl_con *con)
{
	ib_drain_qp(con->qp);
	ib_drain_qp(con->ctrl_qp);
	if (con->dump.mr) {
		ib_dereg_mr(con->dump.mr);
		con->dump.mr = NULL;
	}
	rdl_dump_free_buf(con);
	ib_dma_unmap_single(con->dev, con->tx_ring_dma,
			    RDL_SEND_RING * RDL_MSG_MAX, DMA_TO_DEVICE);
	kfree(con->tx_ring);
	ib_destroy_qp(con->ctrl_qp);
	ib_destroy_qp(con->qp);
}

MODULE_DESCRIPTION("DLM lowcomms over RDMA");
MODULE_LICENSE("GPL");
