/*
 * vdk: initiator of a virtual-disk protocol over one RC QP.  Every request
 * slot owns a type-2 memory window and a bounce buffer carved from one
 * pool.  A request posts, in one chain built from fields of the slot
 * (bind_wr -> cmd_wr), a BIND_MW over its bounce buffer and the command
 * SEND carrying (va, rkey, len); the target moves the data with RDMA
 * READ/WRITE and answers with SEND_WITH_INV on the window's key.  When the
 * answer carries no (or a wrong) remote invalidation, a signaled LOCAL_INV
 * is posted and the slot goes back to the free list from its completion.
 * Completions are dispatched on a tag kept in the low bits of wr_id.
 *
 * Correct: a new key per bind (ibv_inc_rkey of the slot's last key), the
 * remote invalidation is compared with the slot's key, the send queue holds
 * BIND_MW + SEND + LOCAL_INV per slot plus one, windows are unwound when
 * allocation fails.  Migration note: that size is the depth times the
 * ULP's own factor.
 *
 * Not correct: a response with an error status (the target hit a media
 * error half-way through the transfer, so it answers with a plain SEND)
 * completes the slot and puts it back on the free list without
 * invalidating the window; the target still holds a valid key over the
 * bounce buffer that the next request will use.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VDK_WRS_PER_REQ	3	/* BIND_MW, command SEND, LOCAL_INV */
#define VDK_BLK		4096

enum {
	VDK_TAG_SEND = 0,
	VDK_TAG_INV  = 1,
	VDK_TAG_RECV = 2,
	VDK_TAG_MASK = 3,
};

enum {
	VDK_F_SEND_DONE = 1 << 0,
	VDK_F_RSP_DONE  = 1 << 1,
};

struct vdk_cmd {
	uint8_t  op;
	uint8_t  rsvd[3];
	uint32_t tag;
	uint64_t lba;
	uint64_t va;
	uint32_t rkey;
	uint32_t len;
};

struct vdk_rsp {
	uint32_t tag;
	uint16_t status;
	uint16_t rsvd;
};

struct vdk_dev;

struct vdk_req {
	struct vdk_req     *next;
	uint32_t            tag;
	unsigned int        flags;
	int                 status;
	struct ibv_mw      *mw;
	uint32_t            rkey;
	char               *buf;
	uint32_t            len;
	struct vdk_cmd      cmd;
	struct ibv_sge      cmd_sge;
	struct ibv_send_wr  bind_wr;
	struct ibv_send_wr  cmd_wr;
	struct ibv_send_wr  inv_wr;
	void              (*done)(struct vdk_req *r, int status);
} __attribute__((aligned(8)));

struct vdk_dev {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *data_mr;	/* bounce pool, windows are bound over it */
	struct ibv_mr      *cmd_mr;	/* the slot array (commands live in it) */
	struct ibv_mr      *rsp_mr;
	char               *pool;
	struct vdk_rsp     *rsps;
	struct vdk_req     *reqs;
	struct vdk_req     *free;
	unsigned int        depth;
};

int vdk_create_qp(struct vdk_dev *d)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(d->ctx, &da))
		return -EIO;
	if (d->depth * VDK_WRS_PER_REQ + 1 > (unsigned int)da.max_qp_wr)
		d->depth = (da.max_qp_wr - 1) / VDK_WRS_PER_REQ;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = d->cq;
	attr.recv_cq = d->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- three WRs per slot plus one */
	attr.cap.max_send_wr = VDK_WRS_PER_REQ * d->depth + 1; // BUG: rdma-send-queue-manual-factor -- depth times the ULP's own BIND/SEND/INV factor
	attr.cap.max_recv_wr = d->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	d->qp = ibv_create_qp(d->pd, &attr);
	return d->qp ? 0 : -errno;
}

static void vdk_put_req(struct vdk_dev *d, struct vdk_req *r)
{
	r->flags = 0;
	r->next = d->free;
	d->free = r;
}

static struct vdk_req *vdk_get_req(struct vdk_dev *d)
{
	struct vdk_req *r = d->free;

	if (r)
		d->free = r->next;
	return r;
}

int vdk_alloc_reqs(struct vdk_dev *d)
{
	size_t pool_len = (size_t)d->depth * VDK_BLK;
	unsigned int i;

	d->reqs = calloc(d->depth, sizeof(*d->reqs));
	if (!d->reqs)
		return -ENOMEM;
	if (posix_memalign((void **)&d->pool, 4096, pool_len))
		goto err_reqs;
	d->data_mr = ibv_reg_mr(d->pd, d->pool, pool_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!d->data_mr)
		goto err_pool;
	d->cmd_mr = ibv_reg_mr(d->pd, d->reqs, d->depth * sizeof(*d->reqs), 0);
	if (!d->cmd_mr)
		goto err_data_mr;

	for (i = 0; i < d->depth; i++) {
		struct vdk_req *r = &d->reqs[i];

		r->mw = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- one window per slot, managed by the ULP
		if (!r->mw)
			goto err_mw;
		r->tag = i;
		r->rkey = r->mw->rkey;
		r->buf = d->pool + (size_t)i * VDK_BLK;
		vdk_put_req(d, r);
	}
	return 0;

err_mw:
	/* OK: rdma-mr-leak -- every window allocated so far is released */
	while (i--)
		ibv_dealloc_mw(d->reqs[i].mw);
	ibv_dereg_mr(d->cmd_mr);
err_data_mr:
	ibv_dereg_mr(d->data_mr);
err_pool:
	free(d->pool);
err_reqs:
	free(d->reqs);
	d->reqs = NULL;
	d->free = NULL;
	return -ENOMEM;
}

int vdk_submit(struct vdk_dev *d, uint8_t op, uint64_t lba, uint32_t len,
	       void (*done)(struct vdk_req *, int))
{
	struct ibv_send_wr *bad = NULL;
	struct vdk_req *r;
	int is_write = (op == 1);

	if (len > VDK_BLK)
		return -EINVAL;
	r = vdk_get_req(d);
	if (!r)
		return -EAGAIN;
	r->len = len;
	r->done = done;
	r->status = 0;
	r->rkey = ibv_inc_rkey(r->rkey);

	memset(&r->bind_wr, 0, sizeof(r->bind_wr));
	r->bind_wr.wr_id = (uintptr_t)r | VDK_TAG_SEND;
	r->bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-request bind done by the ULP
	r->bind_wr.bind_mw.mw = r->mw;
	/* OK: rdma-rkey-reuse -- the slot's key is rotated with ibv_inc_rkey() above */
	r->bind_wr.bind_mw.rkey = r->rkey;
	r->bind_wr.bind_mw.bind_info.mr = d->data_mr;
	r->bind_wr.bind_mw.bind_info.addr = (uintptr_t)r->buf;
	r->bind_wr.bind_mw.bind_info.length = len;
	r->bind_wr.bind_mw.bind_info.mw_access_flags =
		is_write ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	r->bind_wr.next = &r->cmd_wr;

	r->cmd.op = op;
	r->cmd.tag = htobe32(r->tag);
	r->cmd.lba = htobe64(lba);
	r->cmd.va = htobe64((uintptr_t)r->buf);
	r->cmd.rkey = htobe32(r->rkey);
	r->cmd.len = htobe32(len);
	r->cmd_sge.addr = (uintptr_t)&r->cmd;
	r->cmd_sge.length = sizeof(r->cmd);
	r->cmd_sge.lkey = d->cmd_mr->lkey;

	memset(&r->cmd_wr, 0, sizeof(r->cmd_wr));
	r->cmd_wr.wr_id = (uintptr_t)r | VDK_TAG_SEND;
	r->cmd_wr.opcode = IBV_WR_SEND;
	r->cmd_wr.send_flags = IBV_SEND_SIGNALED;
	r->cmd_wr.sg_list = &r->cmd_sge;
	r->cmd_wr.num_sge = 1;

	if (ibv_post_send(d->qp, &r->bind_wr, &bad)) {
		/* nothing was posted when the chain failed at its first WR */
		if (bad == &r->bind_wr)
			vdk_put_req(d, r); // OK: rdma-invalidation-leak -- the bind was not posted, no key was exposed
		return -EIO;
	}
	return 0;
}

static int vdk_post_recv(struct vdk_dev *d, unsigned int i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&d->rsps[i],
		.length = sizeof(d->rsps[i]),
		.lkey = d->rsp_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = ((uint64_t)i << 2) | VDK_TAG_RECV,
		.sg_list = &sge,
		.num_sge = 1,
	}, *bad;

	return ibv_post_recv(d->qp, &wr, &bad);
}

static void vdk_req_finish(struct vdk_dev *d, struct vdk_req *r)
{
	if ((r->flags & (VDK_F_SEND_DONE | VDK_F_RSP_DONE)) !=
	    (VDK_F_SEND_DONE | VDK_F_RSP_DONE))
		return;
	r->done(r, r->status);
	vdk_put_req(d, r);
}

static int vdk_post_inv(struct vdk_dev *d, struct vdk_req *r)
{
	struct ibv_send_wr *bad;

	memset(&r->inv_wr, 0, sizeof(r->inv_wr));
	r->inv_wr.wr_id = (uintptr_t)r | VDK_TAG_INV;
	r->inv_wr.opcode = IBV_WR_LOCAL_INV;
	r->inv_wr.invalidate_rkey = r->rkey;
	r->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(d->qp, &r->inv_wr, &bad);
}

static void vdk_recv_done(struct vdk_dev *d, struct ibv_wc *wc)
{
	unsigned int i = wc->wr_id >> 2;
	struct vdk_rsp *rsp = &d->rsps[i];
	uint32_t tag = be32toh(rsp->tag);
	struct vdk_req *r;

	if (wc->status != IBV_WC_SUCCESS || tag >= d->depth)
		return;		/* connection is going down */
	r = &d->reqs[tag];

	if (rsp->status) {
		r->status = -EIO;
		r->flags |= VDK_F_RSP_DONE;
		vdk_post_recv(d, i);
		vdk_req_finish(d, r); // BUG: rdma-invalidation-leak -- error responses come without SEND_WITH_INV; the slot goes back to the free list with the window still bound
		return;
	}

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		/* OK: rdma-remote-invalidate-unchecked -- the invalidated key must be this slot's */
		if (wc->invalidated_rkey == r->rkey) {
			r->flags |= VDK_F_RSP_DONE;
			vdk_post_recv(d, i);
			vdk_req_finish(d, r);
			return;
		}
	}
	vdk_post_recv(d, i);
	if (vdk_post_inv(d, r))
		r->status = -EIO;	/* slot stays out until teardown */
}

static void vdk_inv_done(struct vdk_dev *d, struct vdk_req *r, struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		return;		/* window state unknown: keep the slot out */
	r->flags |= VDK_F_RSP_DONE;
	vdk_req_finish(d, r); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- released from the LOCAL_INV completion
}

int vdk_poll(struct vdk_dev *d)
{
	struct ibv_wc wc[16];
	int n, k;

	n = ibv_poll_cq(d->cq, 16, wc);
	for (k = 0; k < n; k++) {
		uint64_t id = wc[k].wr_id;
		struct vdk_req *r = (struct vdk_req *)(uintptr_t)(id & ~(uint64_t)VDK_TAG_MASK);

		switch (id & VDK_TAG_MASK) {
		case VDK_TAG_RECV:
			vdk_recv_done(d, &wc[k]);
			break;
		case VDK_TAG_INV:
			vdk_inv_done(d, r, &wc[k]);
			break;
		case VDK_TAG_SEND:
			if (wc[k].status != IBV_WC_SUCCESS)
				r->status = -EIO;
			r->flags |= VDK_F_SEND_DONE;
			vdk_req_finish(d, r);
			break;
		}
	}
	return n;
}

void vdk_destroy(struct vdk_dev *d)
{
	unsigned int i;

	if (d->qp)
		ibv_destroy_qp(d->qp);
	for (i = 0; i < d->depth; i++)
		ibv_dealloc_mw(d->reqs[i].mw);
	ibv_dereg_mr(d->cmd_mr);
	ibv_dereg_mr(d->data_mr);
	free(d->pool);
	free(d->reqs);
}
