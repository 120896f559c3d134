// SPDX-License-Identifier: GPL-2.0
/*
 * objsvc: kernel target of a small object-storage protocol over RDMA.
 *
 * Clients SEND requests (GET/PUT of an object, BULK_DONE).  Object data
 * moves with the rdma_rw API: PUT payloads are pulled with RDMA READ into
 * the object's pages, GET payloads are pushed with RDMA WRITE and the
 * reply SEND is chained behind them.  Two shortcuts bypass rdma_rw:
 * objects below OBJSVC_INLINE_PULL are READ straight into a kmalloc'd
 * buffer, and very large GETs are "bulk" replies: the target registers the
 * object's pages for remote read and sends the rkey; the client READs at
 * its pace and SENDs BULK_DONE.  Each connection also has a staging MR
 * (set aside for small GET payloads copied out of the object cache) and a
 * header MR (sink of the READ that fetches the client's login header), both
 * registered once at connection setup.
 *
 * Problems: bulk replies allocate and deregister an MR per request; the
 * inline pull READs into memory that has no remote-write rights on iWARP;
 * the header MR's rights are picked by a transport test; the staging MR
 * grants remote read nobody is told about; the PD may carry the unsafe
 * global rkey; the receive queue has no room for the drain and its depth is
 * not checked; keepalives test a counter that never moves.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate -- not annotated in this file
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <linux/unaligned.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define OBJSVC_MAX_REQS		128
#define OBJSVC_RQ_DEPTH		2048
#define OBJSVC_MAX_PAGES	256
#define OBJSVC_INLINE_PULL	4096
#define OBJSVC_BULK_MIN		(1 << 20)
#define OBJSVC_STAGE_SIZE	(64 * 1024)
#define OBJSVC_HDR_SIZE		4096
#define OBJSVC_NOTIFY_INLINE	128
#define OBJSVC_SIGNAL_BATCH	16
#define OBJSVC_KA_BATCH		8

static bool objsvc_trusted_fabric;
module_param(objsvc_trusted_fabric, bool, 0444);
MODULE_PARM_DESC(objsvc_trusted_fabric, "use the PD's global rkey (trusted fabrics only)");

enum { OBJ_GET = 1, OBJ_PUT, OBJ_BULK_DONE, OBJ_KEEPALIVE };

struct obj_wire_req {
	u8	op;
	u8	rsvd[3];
	__le32	len;
	__le64	obj_id;
	__le64	addr;
	__le32	rkey;
	u16	slot;
};

struct obj_wire_reply {
	u16	slot;
	u16	status;
	__le32	len;
	__le64	addr;
	__le32	rkey;
};

struct obj_conn;

struct obj_req {
	struct obj_conn		*conn;
	struct list_head	list;
	u16			slot;
	struct ib_cqe		rw_cqe;
	struct ib_cqe		send_cqe;
	struct ib_cqe		pull_cqe;
	struct rdma_rw_ctx	rw;
	struct sg_table		sgt;
	int			nents;
	enum dma_data_direction	dir;
	struct ib_mr		*bulk_mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_rdma_wr	pull_wr;
	struct ib_sge		pull_sge;
	void			*inline_buf;
	u64			inline_dma;
	struct obj_wire_reply	*reply;
	u64			reply_dma;
	u64			obj_id;
	u32			len;
};

struct obj_recv {
	struct ib_cqe		cqe;
	struct obj_conn		*conn;
	struct obj_wire_req	*msg;
	u64			dma;
};

struct obj_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	u32			port;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	unsigned int		max_reqs;
	struct obj_req		*reqs;
	struct list_head	free_reqs;
	spinlock_t		lock;
	struct obj_recv		*recvs;

	void			*stage;
	struct scatterlist	stage_sg;
	struct ib_mr		*stage_mr;
	void			*hdr_buf;
	struct scatterlist	hdr_sg;
	struct ib_mr		*hdr_mr;
	struct ib_reg_wr	setup_reg[2];
	struct ib_cqe		setup_cqe;
	struct completion	setup_done;
	struct ib_cqe		login_cqe;
	struct completion	login_done;
	enum ib_wc_status	login_status;

	u32			max_inline;
	atomic_t		notify_cnt;
	unsigned int		ka_unsignaled;
	struct ib_send_wr	ctrl_wr;
	struct ib_sge		ctrl_sge;
};

struct obj_device {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
};

/* Provided by the object store. */
int objstore_map(u64 obj_id, u32 len, struct sg_table *sgt, bool create);
void objstore_unmap(struct sg_table *sgt);
int objstore_put_small(u64 obj_id, const void *data, u32 len);

int obj_add_one(struct obj_device *odev)
{
	odev->pd = ib_alloc_pd(odev->ibdev,
			       objsvc_trusted_fabric ? IB_PD_UNSAFE_GLOBAL_RKEY : 0);	// BUG: rdma-remote-access-overbroad -- the global rkey opens all kernel memory to any peer that learns it
	if (IS_ERR(odev->pd))
		return PTR_ERR(odev->pd);
	return 0;
}

static int obj_create_qp(struct obj_conn *conn)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_type = IB_QPT_RC;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.send_cq = conn->cq;
	init_attr.recv_cq = conn->cq;
	init_attr.port_num = conn->port;
	/* bulk replies: REG_MR + SEND; inline pulls: READ, then SEND */
	// OK: rdma-send-queue-undersized -- two WRs per request plus the drain's
	init_attr.cap.max_send_wr = 2 * conn->max_reqs + 1;	// OK: rdma-send-queue-manual-factor -- the QP declares max_rdma_ctxs
	init_attr.cap.max_rdma_ctxs = conn->max_reqs *
		rdma_rw_mr_factor(conn->dev, conn->port, OBJSVC_MAX_PAGES);
	// BUG(file): rdma-send-queue-undersized -- every receive slot is kept posted, ib_drain_qp() finds no room for its receive
	init_attr.cap.max_recv_wr = OBJSVC_RQ_DEPTH;	// BUG: rdma-queue-cap-unchecked -- 2048 receives, never compared with attrs.max_qp_wr
	init_attr.cap.max_send_sge = rdma_protocol_iwarp(conn->dev, conn->port) ? 1 : 2;	// OK: rdma-access-flags-transport -- the transport test sizes the queue, it picks no access flags
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_inline_data = OBJSVC_NOTIFY_INLINE;	// OK: rdma-queue-cap-unchecked -- the granted size is read back below

	ret = rdma_create_qp(conn->cm_id, conn->pd, &init_attr);
	if (ret)
		return ret;
	conn->qp = conn->cm_id->qp;
	conn->max_inline = init_attr.cap.max_inline_data;
	return 0;
}

static void obj_setup_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct obj_conn *conn = container_of(wc->wr_cqe, struct obj_conn, setup_cqe);

	if (wc->status != IB_WC_SUCCESS)
		pr_err("objsvc: setup REG_MR: %s\n", ib_wc_status_msg(wc->status));
	complete(&conn->setup_done);
}

/* Staging and header MRs: registered once, for the connection's lifetime. */
static int obj_conn_setup_mrs(struct obj_conn *conn)
{
	int hdr_access = IB_ACCESS_LOCAL_WRITE;
	int ret;

	conn->stage = kzalloc(OBJSVC_STAGE_SIZE, GFP_KERNEL);
	conn->hdr_buf = kzalloc(OBJSVC_HDR_SIZE, GFP_KERNEL);
	if (!conn->stage || !conn->hdr_buf)
		return -ENOMEM;
	sg_init_one(&conn->stage_sg, conn->stage, OBJSVC_STAGE_SIZE);
	sg_init_one(&conn->hdr_sg, conn->hdr_buf, OBJSVC_HDR_SIZE);
	if (ib_dma_map_sg(conn->dev, &conn->stage_sg, 1, DMA_TO_DEVICE) != 1 ||
	    ib_dma_map_sg(conn->dev, &conn->hdr_sg, 1, DMA_FROM_DEVICE) != 1)
		return -EIO;

	conn->stage_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
				     OBJSVC_STAGE_SIZE >> PAGE_SHIFT);	// OK: rdma-registration-in-datapath -- connection setup, kept next to the QP
	if (IS_ERR(conn->stage_mr))
		return PTR_ERR(conn->stage_mr);
	conn->hdr_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, 1);
	if (IS_ERR(conn->hdr_mr))
		return PTR_ERR(conn->hdr_mr);
	if (ib_map_mr_sg(conn->stage_mr, &conn->stage_sg, 1, NULL, PAGE_SIZE) != 1 ||
	    ib_map_mr_sg(conn->hdr_mr, &conn->hdr_sg, 1, NULL, PAGE_SIZE) != 1)
		return -EINVAL;

	memset(conn->setup_reg, 0, sizeof(conn->setup_reg));
	conn->setup_reg[0].wr.opcode = IB_WR_REG_MR;
	conn->setup_reg[0].wr.next = &conn->setup_reg[1].wr;
	conn->setup_reg[0].mr = conn->stage_mr;	// OK: rdma-rkey-reuse -- registered once for the connection's lifetime
	conn->setup_reg[0].key = conn->stage_mr->rkey;
	conn->setup_reg[0].access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;	// BUG: rdma-remote-access-overbroad -- only the lkey of the staging MR is ever used; no client gets its rkey

	if (rdma_protocol_iwarp(conn->dev, conn->port))
		hdr_access |= IB_ACCESS_REMOTE_WRITE;
	conn->setup_reg[1].wr.opcode = IB_WR_REG_MR;
	conn->setup_reg[1].wr.send_flags = IB_SEND_SIGNALED;
	conn->setup_reg[1].wr.wr_cqe = &conn->setup_cqe;
	conn->setup_reg[1].mr = conn->hdr_mr;
	conn->setup_reg[1].key = conn->hdr_mr->rkey;
	// OK: rdma-remote-access-overbroad -- REMOTE_WRITE only for the iWARP READ sink
	conn->setup_reg[1].access = hdr_access;	// BUG: rdma-access-flags-transport -- READ-sink rights picked by an inline iWARP test

	conn->setup_cqe.done = obj_setup_reg_done;
	init_completion(&conn->setup_done);
	ret = ib_post_send(conn->qp, &conn->setup_reg[0].wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&conn->setup_done);
	return 0;
}

static void obj_login_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct obj_conn *conn = container_of(wc->wr_cqe, struct obj_conn, login_cqe);

	conn->login_status = wc->status;
	complete(&conn->login_done);
}

/* The client's login header does not fit a receive: READ it from the client. */
int obj_conn_login(struct obj_conn *conn, u64 raddr, u32 rkey, u32 len)
{
	struct ib_rdma_wr wr;
	struct ib_sge sge;
	int ret;

	if (len > OBJSVC_HDR_SIZE)
		return -EMSGSIZE;
	sge.addr = conn->hdr_mr->iova;
	sge.length = len;
	sge.lkey = conn->hdr_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	conn->login_cqe.done = obj_login_done;
	wr.wr.opcode = IB_WR_RDMA_READ;
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.wr.wr_cqe = &conn->login_cqe;
	wr.wr.sg_list = &sge;
	wr.wr.num_sge = 1;
	wr.remote_addr = raddr;
	wr.rkey = rkey;
	init_completion(&conn->login_done);
	ret = ib_post_send(conn->qp, &wr.wr, NULL);	// OK: rdma-access-flags-transport -- the header MR gets REMOTE_WRITE on iWARP (the inline test is reported where it is registered)
	if (ret)
		return ret;
	wait_for_completion(&conn->login_done);
	return conn->login_status == IB_WC_SUCCESS ? 0 : -EIO;
}

static void obj_put_req(struct obj_req *req)
{
	struct obj_conn *conn = req->conn;
	unsigned long flags;

	spin_lock_irqsave(&conn->lock, flags);
	list_add(&req->list, &conn->free_reqs);
	spin_unlock_irqrestore(&conn->lock, flags);
}

static void obj_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct obj_req *req = container_of(wc->wr_cqe, struct obj_req, send_cqe);

	if (req->dir == DMA_TO_DEVICE && req->nents && !req->bulk_mr) {
		rdma_rw_ctx_destroy(&req->rw, req->conn->qp, req->conn->port,
				    req->sgt.sgl, req->nents, DMA_TO_DEVICE);
		objstore_unmap(&req->sgt);
		req->nents = 0;
	}
	if (!req->bulk_mr)
		obj_put_req(req);
}

static void obj_build_reply(struct obj_conn *conn, struct obj_req *req)
{
	req->send_sge.addr = req->reply_dma;
	req->send_sge.length = sizeof(*req->reply);
	req->send_sge.lkey = conn->pd->local_dma_lkey;
	req->send_cqe.done = obj_send_done;
	memset(&req->send_wr, 0, sizeof(req->send_wr));
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.send_flags = IB_SEND_SIGNALED;
}

static int obj_post_reply(struct obj_conn *conn, struct obj_req *req,
			  struct ib_send_wr *first)
{
	obj_build_reply(conn, req);
	return ib_post_send(conn->qp, first ? first : &req->send_wr, NULL);
}

static void obj_bulk_release(struct obj_req *req)
{
	ib_dereg_mr(req->bulk_mr);	// BUG: rdma-registration-in-datapath -- a device command per bulk reply, from the receive completion path
	req->bulk_mr = NULL;
	objstore_unmap(&req->sgt);
	req->nents = 0;
}

static int obj_bulk_reply(struct obj_conn *conn, struct obj_req *req)
{
	int n, ret;

	req->bulk_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, req->nents);	// BUG: rdma-registration-in-datapath -- one MR allocated per bulk GET
	if (IS_ERR(req->bulk_mr)) {
		ret = PTR_ERR(req->bulk_mr);
		req->bulk_mr = NULL;
		return ret;
	}
	n = ib_map_mr_sg(req->bulk_mr, req->sgt.sgl, req->nents, NULL, PAGE_SIZE);
	if (n < req->nents) {
		obj_bulk_release(req);
		return -EINVAL;
	}
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->bulk_mr;	// OK: rdma-rkey-reuse -- a fresh MR, registered once and deregistered after BULK_DONE
	req->reg_wr.key = req->bulk_mr->rkey;
	req->reg_wr.access = IB_ACCESS_REMOTE_READ;	// OK: rdma-remote-access-overbroad -- the rkey goes to the client in the reply

	req->reply->len = cpu_to_le32(req->len);
	req->reply->addr = cpu_to_le64(req->bulk_mr->iova);
	put_unaligned_le32(req->bulk_mr->rkey, &req->reply->rkey);
	req->reg_wr.wr.next = &req->send_wr;
	ret = obj_post_reply(conn, req, &req->reg_wr.wr);
	if (ret)
		obj_bulk_release(req);
	return ret;
}

static void obj_pull_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct obj_req *req = container_of(wc->wr_cqe, struct obj_req, pull_cqe);
	struct obj_conn *conn = req->conn;
	int ret = -EIO;

	ib_dma_unmap_single(conn->dev, req->inline_dma, req->len, DMA_FROM_DEVICE);
	if (wc->status == IB_WC_SUCCESS)
		ret = objstore_put_small(req->obj_id, req->inline_buf, req->len);
	kfree(req->inline_buf);
	req->reply->status = ret ? 1 : 0;
	if (obj_post_reply(conn, req, NULL))
		obj_put_req(req);
}

static int obj_inline_pull(struct obj_conn *conn, struct obj_req *req,
			   u64 raddr, u32 rkey)
{
	req->inline_buf = kmalloc(req->len, GFP_KERNEL);
	if (!req->inline_buf)
		return -ENOMEM;
	req->inline_dma = ib_dma_map_single(conn->dev, req->inline_buf, req->len,
					    DMA_FROM_DEVICE);
	req->pull_sge.addr = req->inline_dma;
	req->pull_sge.length = req->len;
	req->pull_sge.lkey = conn->pd->local_dma_lkey;

	req->pull_cqe.done = obj_pull_done;
	memset(&req->pull_wr, 0, sizeof(req->pull_wr));
	req->pull_wr.wr.opcode = IB_WR_RDMA_READ;
	req->pull_wr.wr.wr_cqe = &req->pull_cqe;
	req->pull_wr.wr.send_flags = IB_SEND_SIGNALED;
	req->pull_wr.wr.sg_list = &req->pull_sge;
	req->pull_wr.wr.num_sge = 1;
	req->pull_wr.remote_addr = raddr;
	req->pull_wr.rkey = rkey;
	return ib_post_send(conn->qp, &req->pull_wr.wr, NULL);	// BUG: rdma-access-flags-transport -- READ sink addressed with local_dma_lkey has no remote-write rights, fails on iWARP
}

static void obj_rw_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct obj_req *req = container_of(wc->wr_cqe, struct obj_req, rw_cqe);
	struct obj_conn *conn = req->conn;

	rdma_rw_ctx_destroy(&req->rw, conn->qp, conn->port, req->sgt.sgl,
			    req->nents, DMA_FROM_DEVICE);
	objstore_unmap(&req->sgt);
	req->nents = 0;
	req->reply->status = wc->status == IB_WC_SUCCESS ? 0 : 1;
	if (obj_post_reply(conn, req, NULL))
		obj_put_req(req);
}

static int obj_handle_rw(struct obj_conn *conn, struct obj_req *req,
			 u64 raddr, u32 rkey)
{
	struct ib_send_wr *chain = NULL;
	struct ib_cqe *cqe = NULL;
	int ret;

	ret = rdma_rw_ctx_init(&req->rw, conn->qp, conn->port, req->sgt.sgl,
			       req->nents, 0, raddr, rkey, req->dir);	// OK: rdma-access-flags-transport -- rdma_rw builds the READ and its sink rights
	if (ret < 0)
		return ret;
	if (req->dir == DMA_FROM_DEVICE) {
		req->rw_cqe.done = obj_rw_done;
		cqe = &req->rw_cqe;
	} else {
		obj_build_reply(conn, req);
		chain = &req->send_wr;
	}
	return rdma_rw_ctx_post(&req->rw, conn->qp, conn->port, cqe, chain);
}

/* Connection-level messages: notifications and keepalives, always inline. */
int obj_notify(struct obj_conn *conn, const void *msg, u32 len)
{
	conn->ctrl_sge.addr = (uintptr_t)msg;
	conn->ctrl_sge.length = len;
	memset(&conn->ctrl_wr, 0, sizeof(conn->ctrl_wr));
	conn->ctrl_wr.opcode = IB_WR_SEND;
	conn->ctrl_wr.sg_list = &conn->ctrl_sge;
	conn->ctrl_wr.num_sge = 1;
	conn->ctrl_wr.send_flags = IB_SEND_INLINE;
	if (atomic_inc_return(&conn->notify_cnt) % OBJSVC_SIGNAL_BATCH == 0)	// OK: rdma-unsignaled-send-starvation -- the counter advances with every notification
		conn->ctrl_wr.send_flags |= IB_SEND_SIGNALED;
	return ib_post_send(conn->qp, &conn->ctrl_wr, NULL);
}

int obj_keepalive(struct obj_conn *conn)
{
	static const u8 ka_msg[4] = { OBJ_KEEPALIVE };

	conn->ctrl_sge.addr = (uintptr_t)ka_msg;
	conn->ctrl_sge.length = sizeof(ka_msg);
	memset(&conn->ctrl_wr, 0, sizeof(conn->ctrl_wr));
	conn->ctrl_wr.opcode = IB_WR_SEND;
	conn->ctrl_wr.sg_list = &conn->ctrl_sge;
	conn->ctrl_wr.num_sge = 1;
	conn->ctrl_wr.send_flags = IB_SEND_INLINE;
	if (conn->ka_unsignaled >= OBJSVC_KA_BATCH) {	// BUG: rdma-unsignaled-send-starvation -- ka_unsignaled is reset but never advanced, keepalives are never signaled
		conn->ctrl_wr.send_flags |= IB_SEND_SIGNALED;
		conn->ka_unsignaled = 0;
	}
	return ib_post_send(conn->qp, &conn->ctrl_wr, NULL);
}

static int obj_post_recv(struct obj_conn *conn, struct obj_recv *r);

static void obj_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct obj_recv *r = container_of(wc->wr_cqe, struct obj_recv, cqe);
	struct obj_conn *conn = r->conn;
	struct obj_wire_req *m = r->msg;
	struct obj_req *req;
	unsigned long flags;
	int ret = 0;

	if (wc->status != IB_WC_SUCCESS)
		return;
	if (m->op == OBJ_BULK_DONE) {
		req = &conn->reqs[m->slot % conn->max_reqs];
		if (req->bulk_mr) {
			obj_bulk_release(req);
			obj_put_req(req);
		}
		goto repost;
	}

	spin_lock_irqsave(&conn->lock, flags);
	req = list_first_entry_or_null(&conn->free_reqs, struct obj_req, list);
	if (req)
		list_del(&req->list);
	spin_unlock_irqrestore(&conn->lock, flags);
	if (!req)
		goto repost;

	req->obj_id = le64_to_cpu(m->obj_id);
	req->len = le32_to_cpu(m->len);
	req->reply->slot = req->slot;
	req->reply->status = 0;
	if (m->op == OBJ_PUT && req->len < OBJSVC_INLINE_PULL) {
		ret = obj_inline_pull(conn, req, le64_to_cpu(m->addr), le32_to_cpu(m->rkey));
	} else {
		req->dir = m->op == OBJ_PUT ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
		req->nents = objstore_map(req->obj_id, req->len, &req->sgt, m->op == OBJ_PUT);
		if (req->nents <= 0)
			ret = -EIO;
		else if (m->op == OBJ_GET && req->len >= OBJSVC_BULK_MIN)
			ret = obj_bulk_reply(conn, req);
		else
			ret = obj_handle_rw(conn, req, le64_to_cpu(m->addr), le32_to_cpu(m->rkey));
	}
	if (ret)
		obj_put_req(req);
repost:
	obj_post_recv(conn, r);
}

static int obj_post_recv(struct obj_conn *conn, struct obj_recv *r)
{
	struct ib_sge sge = { .addr = r->dma, .length = sizeof(*r->msg),
			      .lkey = conn->pd->local_dma_lkey };
	struct ib_recv_wr wr = { .sg_list = &sge, .num_sge = 1 };

	r->cqe.done = obj_recv_done;
	wr.wr_cqe = &r->cqe;
	return ib_post_recv(conn->qp, &wr, NULL);
}

int obj_conn_start(struct obj_conn *conn)
{
	int i, ret;

	ret = obj_create_qp(conn);
	if (ret)
		return ret;
	ret = obj_conn_setup_mrs(conn);
	if (ret)
		return ret;
	for (i = 0; i < OBJSVC_RQ_DEPTH; i++) {
		ret = obj_post_recv(conn, &conn->recvs[i]);
		if (ret)
			return ret;
	}
	return 0;
}

void obj_conn_stop(struct obj_conn *conn)
{
	unsigned int i;

	ib_drain_qp(conn->qp);
	for (i = 0; i < conn->max_reqs; i++)
		if (conn->reqs[i].bulk_mr)
			ib_dereg_mr(conn->reqs[i].bulk_mr);	// OK: rdma-registration-in-datapath -- teardown walks the whole request table
	ib_dereg_mr(conn->hdr_mr);
	ib_dereg_mr(conn->stage_mr);
	rdma_destroy_qp(conn->cm_id);
}

MODULE_DESCRIPTION("objsvc RDMA target");
MODULE_LICENSE("GPL");
