// SPDX-License-Identifier: GPL-2.0
/*
 * sb_smbd_conn.c - SMB Direct style transport shared by the SMB3 client
 * and server code.
 *
 * Data the peer advertises with buffer descriptors is pulled or pushed
 * with the rdma_rw API; the core owns those MRs.  Buffers this side
 * advertises (SMB2 READ/WRITE through the RDMA channel) are registered
 * with FRWR from a per-connection MR table and the descriptor carries the
 * rkey.  With SMB2_CHANNEL_RDMA_V1_INVALIDATE the server kills the key
 * with SEND_WITH_INV in its response; otherwise the client posts a
 * LOCAL_INV and waits for it before the pages go back to the caller.
 *
 * Problems in this version:
 *  - the receive handler takes any remote invalidation as the one of the
 *    response's own MR, without looking at which rkey was invalidated;
 *  - a READ that times out hands its buffer back while the server still
 *    holds the rkey;
 *  - for buffers the server could only read, deregistration does not
 *    wait for the LOCAL_INV before the pages are reused.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define SMBD_IO_TIMEOUT_MS	(60 * 1000)
#define SMBD_MAX_FRMR_PAGES	256
#define SMBD_NEGOTIATE		1
#define SMBD_CONNECTED		2

enum smbd_mr_state {
	MR_READY,
	MR_REGISTERED,
	MR_ERROR,
};

struct smbd_buffer_desc {
	__le64	offset;
	__le32	token;
	__le32	length;
};

struct smbd_params {
	unsigned int	send_credit_target;
	unsigned int	recv_credit_max;
	unsigned int	max_rw_ios;
	unsigned int	max_rw_size;
};

struct smbd_conn;

struct smbd_mr {
	struct list_head	list;
	struct smbd_conn	*sc;
	struct ib_mr		*mr;
	enum smbd_mr_state	state;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	bool			remote_invalidated;
	struct ib_reg_wr	wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	invalidate_done;
};

struct smbd_io {
	struct smbd_conn	*sc;
	u64			msg_id;
	struct smbd_mr		*mr;
	struct scatterlist	*sg;
	int			nents;
	struct smbd_buffer_desc	*desc;		/* in the request buffer */
	u64			req_dma;
	u32			req_len;
	struct ib_sge		sge;
	struct ib_cqe		send_cqe;
	struct completion	done;
	int			status;
};

struct smbd_rw_msg {
	struct rdma_rw_ctx	rw_ctx;
	struct sg_table		sgt;
	struct ib_cqe		cqe;
	struct completion	done;
	int			status;
};

struct smbd_recv_io {
	struct smbd_conn	*sc;
	struct ib_cqe		cqe;
	u64			dma;
	void			*buf;		/* starts with struct smbd_rsp_hdr */
};

struct smbd_rsp_hdr {
	__le64	msg_id;
	__le32	status;
	__le32	data_length;
};

struct smbd_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct smbd_params	params;
	int			state;
	unsigned int		rw_ctxs;
	unsigned int		mr_count;
	struct smbd_mr		*mrs;
	spinlock_t		mr_lock;
	struct list_head	mr_free;
	struct smbd_io		**ios;		/* by msg_id modulo credits */
	struct work_struct	mr_recovery_work;
	struct work_struct	disconnect_work;
};

static void smbd_disconnect(struct smbd_conn *sc)
{
	queue_work(system_wq, &sc->disconnect_work);
}

static struct smbd_mr *smbd_mr_get(struct smbd_conn *sc)
{
	struct smbd_mr *mr;

	spin_lock(&sc->mr_lock);
	mr = list_first_entry_or_null(&sc->mr_free, struct smbd_mr, list);
	if (mr)
		list_del(&mr->list);
	spin_unlock(&sc->mr_lock);
	return mr;
}

static void smbd_mr_put(struct smbd_conn *sc, struct smbd_mr *mr)
{
	ib_dma_unmap_sg(sc->ibdev, mr->sgl, mr->sgl_count, mr->dir);
	mr->state = MR_READY;
	spin_lock(&sc->mr_lock);
	list_add_tail(&mr->list, &sc->mr_free);
	spin_unlock(&sc->mr_lock);
}

static void smbd_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		mr->state = MR_ERROR;
		smbd_disconnect(mr->sc);
	}
}

static void smbd_local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	if (wc->status != IB_WC_SUCCESS)
		mr->state = MR_ERROR;
	complete(&mr->invalidate_done);
}

static struct smbd_mr *smbd_register_mr(struct smbd_conn *sc,
					struct scatterlist *sg, int nents,
					bool writing)
{
	struct smbd_mr *mr;
	int n, rc;

	mr = smbd_mr_get(sc);
	if (!mr)
		return ERR_PTR(-EAGAIN);

	mr->sgl = sg;
	mr->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->remote_invalidated = false;
	mr->sgl_count = ib_dma_map_sg(sc->ibdev, sg, nents, mr->dir);
	if (!mr->sgl_count) {
		rc = -EIO;
		goto out_put;
	}

	n = ib_map_mr_sg(mr->mr, sg, mr->sgl_count, NULL, PAGE_SIZE);
	if (n != mr->sgl_count) {
		rc = -EIO;
		goto out_unmap;
	}

	ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));
	mr->cqe.done = smbd_reg_done;
	mr->wr.wr.opcode = IB_WR_REG_MR;
	mr->wr.wr.wr_cqe = &mr->cqe;
	mr->wr.wr.num_sge = 0;
	mr->wr.wr.next = NULL;
	mr->wr.wr.send_flags = IB_SEND_SIGNALED;
	mr->wr.mr = mr->mr;
	mr->wr.key = mr->mr->rkey;
	mr->wr.access = writing ?
		IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
		IB_ACCESS_REMOTE_READ;

	mr->state = MR_REGISTERED;
	rc = ib_post_send(sc->qp, &mr->wr.wr, NULL);
	if (!rc)
		return mr;

	pr_err("REG_MR post failed (%d)\n", rc);
	smbd_disconnect(sc);
	smbd_mr_put(sc, mr);	/* OK: rdma-invalidation-leak -- the REG_MR post failed, the rkey was never handed out */
	return ERR_PTR(rc);

out_unmap:
	ib_dma_unmap_sg(sc->ibdev, sg, nents, mr->dir);
out_put:
	spin_lock(&sc->mr_lock);
	list_add_tail(&mr->list, &sc->mr_free);	/* OK: rdma-invalidation-leak -- mapping failed, no REG_MR was posted for this MR */
	spin_unlock(&sc->mr_lock);
	return ERR_PTR(rc);
}

static void smbd_deregister_mr(struct smbd_conn *sc, struct smbd_mr *mr)
{
	int rc;

	if (mr->remote_invalidated) {
		smbd_mr_put(sc, mr);	/* OK: rdma-invalidation-leak -- the response came with a remote invalidation (how that was accepted is smbd_recv_done's problem) */
		return;
	}

	memset(&mr->inv_wr, 0, sizeof(mr->inv_wr));
	mr->inv_wr.opcode = IB_WR_LOCAL_INV;
	mr->inv_wr.ex.invalidate_rkey = mr->mr->rkey;
	mr->cqe.done = smbd_local_inv_done;
	mr->inv_wr.wr_cqe = &mr->cqe;

	if (mr->dir == DMA_TO_DEVICE) {
		/*
		 * The server could only read this buffer and nothing can land
		 * in it any more, so do not wait for the invalidation.
		 */
		rc = ib_post_send(sc->qp, &mr->inv_wr, NULL);
		if (rc) {
			mr->state = MR_ERROR;
			queue_work(system_wq, &sc->mr_recovery_work);
			return;
		}
		smbd_mr_put(sc, mr);	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV has not executed; the pages are unmapped and reused while the server can still read them */
		return;
	}

	mr->inv_wr.send_flags = IB_SEND_SIGNALED;
	reinit_completion(&mr->invalidate_done);
	rc = ib_post_send(sc->qp, &mr->inv_wr, NULL);
	if (rc) {
		mr->state = MR_ERROR;
		queue_work(system_wq, &sc->mr_recovery_work);
		return;
	}

	wait_for_completion(&mr->invalidate_done);
	if (mr->state == MR_ERROR) {
		queue_work(system_wq, &sc->mr_recovery_work);
		return;
	}
	smbd_mr_put(sc, mr);	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- waited for the signaled LOCAL_INV, which succeeded */
}

static void smbd_mr_recovery_work(struct work_struct *work)
{
	struct smbd_conn *sc = container_of(work, struct smbd_conn, mr_recovery_work);
	unsigned int i;

	for (i = 0; i < sc->mr_count; i++) {
		struct smbd_mr *mr = &sc->mrs[i];

		if (mr->state != MR_ERROR)
			continue;
		ib_dereg_mr(mr->mr);
		mr->mr = ib_alloc_mr(sc->pd, IB_MR_TYPE_MEM_REG,
				     SMBD_MAX_FRMR_PAGES);
		if (IS_ERR(mr->mr)) {
			mr->mr = NULL;
			smbd_disconnect(sc);
			return;
		}
		smbd_mr_put(sc, mr);	/* OK: rdma-invalidation-leak -- the old MR was deregistered, its rkey is gone */
	}
}

static void smbd_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_io *io = container_of(wc->wr_cqe, struct smbd_io, send_cqe);

	if (wc->status != IB_WC_SUCCESS)
		smbd_disconnect(io->sc);
}

static int smbd_post_send_msg(struct smbd_conn *sc, struct smbd_io *io)
{
	struct ib_send_wr wr;

	io->sge.addr = io->req_dma;
	io->sge.length = io->req_len;
	io->sge.lkey = sc->pd->local_dma_lkey;
	io->send_cqe.done = smbd_send_done;

	memset(&wr, 0, sizeof(wr));
	wr.wr_cqe = &io->send_cqe;
	wr.sg_list = &io->sge;
	wr.num_sge = 1;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(sc->qp, &wr, NULL);
}

/* SMB2 READ through the RDMA channel: the server writes into io->sg. */
static int smbd_read_via_rdma(struct smbd_conn *sc, struct smbd_io *io)
{
	struct smbd_mr *mr;
	int rc;

	mr = smbd_register_mr(sc, io->sg, io->nents, true);
	if (IS_ERR(mr))
		return PTR_ERR(mr);
	io->mr = mr;
	io->desc->offset = cpu_to_le64(mr->mr->iova);
	io->desc->token = cpu_to_le32(mr->mr->rkey);
	io->desc->length = cpu_to_le32(mr->mr->length);

	init_completion(&io->done);
	rc = smbd_post_send_msg(sc, io);
	if (rc)
		goto out_dereg;

	if (!wait_for_completion_timeout(&io->done,
					 msecs_to_jiffies(SMBD_IO_TIMEOUT_MS))) {
		pr_warn("READ %llu timed out\n", io->msg_id);
		io->mr = NULL;
		smbd_mr_put(sc, mr);	/* BUG: rdma-invalidation-leak -- the server got the rkey and may still write into the buffer; no LOCAL_INV on the timeout path */
		return -ETIMEDOUT;
	}
	rc = io->status;

out_dereg:
	io->mr = NULL;
	smbd_deregister_mr(sc, mr);
	return rc;
}

static void smbd_rw_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_rw_msg *msg = container_of(wc->wr_cqe, struct smbd_rw_msg, cqe);

	msg->status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&msg->done);
}

/* Server side: move data described by the peer's buffer descriptor. */
static int smbd_rdma_rw(struct smbd_conn *sc, struct smbd_rw_msg *msg,
			struct smbd_buffer_desc *desc, bool is_read)
{
	enum dma_data_direction dir = is_read ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	u32 port = sc->cm_id->port_num;
	int ret;

	ret = rdma_rw_ctx_init(&msg->rw_ctx, sc->qp, port, msg->sgt.sgl,
			       msg->sgt.nents, 0, le64_to_cpu(desc->offset),
			       le32_to_cpu(desc->token), dir);
	if (ret < 0)
		return ret;

	init_completion(&msg->done);
	msg->cqe.done = smbd_rw_done;
	ret = rdma_rw_ctx_post(&msg->rw_ctx, sc->qp, port, &msg->cqe, NULL);
	if (!ret) {
		wait_for_completion(&msg->done);
		ret = msg->status;
	}
	/* OK: rdma-invalidation-leak -- rdma_rw MRs belong to the core; on IB they carry no remote rights and iWARP read sinks die with READ_WITH_INV */
	rdma_rw_ctx_destroy(&msg->rw_ctx, sc->qp, port, msg->sgt.sgl,
			    msg->sgt.nents, dir);
	return ret;
}

static int smbd_negotiate_rsp(struct smbd_conn *sc, struct smbd_recv_io *rx,
			      struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		pr_err("remote invalidation on the negotiate response\n");
		return -EPROTO;	/* OK: rdma-remote-invalidate-unchecked -- refused: no key exists before negotiation */
	}
	if (wc->byte_len < sizeof(struct smbd_rsp_hdr))
		return -EPROTO;
	sc->state = SMBD_CONNECTED;
	return 0;
}

static int smbd_post_recv(struct smbd_conn *sc, struct smbd_recv_io *rx)
{
	struct ib_sge sge = {
		.addr = rx->dma, .length = 1364, .lkey = sc->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_cqe = &rx->cqe, .sg_list = &sge, .num_sge = 1,
	};

	return ib_post_recv(sc->qp, &wr, NULL);
}

static void smbd_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_recv_io *rx = container_of(wc->wr_cqe, struct smbd_recv_io, cqe);
	struct smbd_conn *sc = rx->sc;
	struct smbd_rsp_hdr *hdr = rx->buf;
	struct smbd_io *io;

	if (wc->status != IB_WC_SUCCESS) {
		smbd_disconnect(sc);
		return;
	}

	if (sc->state == SMBD_NEGOTIATE) {
		if (smbd_negotiate_rsp(sc, rx, wc))
			smbd_disconnect(sc);
		goto repost;
	}

	io = sc->ios[le64_to_cpu(hdr->msg_id) % sc->params.send_credit_target];
	if (!io || io->msg_id != le64_to_cpu(hdr->msg_id))
		goto repost;

	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) && io->mr)
		io->mr->remote_invalidated = true;	/* BUG: rdma-remote-invalidate-unchecked -- wc->ex.invalidate_rkey is never compared with io->mr's rkey */
	io->status = le32_to_cpu(hdr->status);
	complete(&io->done);

repost:
	smbd_post_recv(sc, rx);
}

static int smbd_create_qp(struct smbd_conn *sc)
{
	struct smbd_params *sp = &sc->params;
	u32 port = sc->cm_id->port_num;
	struct ib_qp_init_attr qp_attr;
	unsigned int max_send_wr;

	sc->rw_ctxs = sp->max_rw_ios *
		rdma_rw_mr_factor(sc->ibdev, port, sp->max_rw_size >> PAGE_SHIFT);

	memset(&qp_attr, 0, sizeof(qp_attr));
	/* OK: rdma-send-queue-manual-factor -- the rdma_rw part is declared through max_rdma_ctxs; the term covers the REG_MR/LOCAL_INV of the advertised buffers, which no core API registers */
	qp_attr.cap.max_send_wr = sp->send_credit_target + 2 * sc->mr_count + 1; /* OK: rdma-send-queue-undersized -- one SEND per credit, REG_MR and LOCAL_INV per advertised MR, one for the drain; rdma_rw adds its own */
	qp_attr.cap.max_rdma_ctxs = sc->rw_ctxs;
	qp_attr.cap.max_recv_wr = sp->recv_credit_max + 1;
	qp_attr.cap.max_send_sge = 2;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.port_num = port;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;

	max_send_wr = rdma_rw_max_send_wr(sc->ibdev, port, sc->rw_ctxs, 0) +
		      sp->send_credit_target + 2 * sc->mr_count + 1;
	sc->send_cq = ib_alloc_cq(sc->ibdev, sc, max_send_wr, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(sc->send_cq))
		return PTR_ERR(sc->send_cq);
	sc->recv_cq = ib_alloc_cq(sc->ibdev, sc, sp->recv_credit_max + 1, 0,
				  IB_POLL_SOFTIRQ);
	if (IS_ERR(sc->recv_cq)) {
		ib_free_cq(sc->send_cq);
		return PTR_ERR(sc->recv_cq);
	}
	qp_attr.send_cq = sc->send_cq;
	qp_attr.recv_cq = sc->recv_cq;

	if (rdma_create_qp(sc->cm_id, sc->pd, &qp_attr)) {
		ib_free_cq(sc->recv_cq);
		ib_free_cq(sc->send_cq);
		return -ENODEV;
	}
	sc->qp = sc->cm_id->qp;
	INIT_WORK(&sc->mr_recovery_work, smbd_mr_recovery_work);
	return 0;
}

static void smbd_destroy(struct smbd_conn *sc)
{
	unsigned int i;

	rdma_disconnect(sc->cm_id);
	ib_drain_qp(sc->qp);
	cancel_work_sync(&sc->mr_recovery_work);
	for (i = 0; i < sc->mr_count; i++)
		if (sc->mrs[i].mr)
			ib_dereg_mr(sc->mrs[i].mr);	/* OK: rdma-invalidation-leak -- deregistration kills every key still out */
	rdma_destroy_qp(sc->cm_id);
	ib_free_cq(sc->send_cq);
	ib_free_cq(sc->recv_cq);
}

struct smbd_transport_ops {
	int (*create_qp)(struct smbd_conn *sc);
	void (*destroy)(struct smbd_conn *sc);
	int (*read)(struct smbd_conn *sc, struct smbd_io *io);
	int (*rdma_rw)(struct smbd_conn *sc, struct smbd_rw_msg *msg,
		       struct smbd_buffer_desc *desc, bool is_read);
	void (*recv_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct smbd_transport_ops smbd_rdma_ops = {
	.create_qp	= smbd_create_qp,
	.destroy	= smbd_destroy,
	.read		= smbd_read_via_rdma,
	.rdma_rw	= smbd_rdma_rw,
	.recv_done	= smbd_recv_done,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb SMB Direct style transport");
