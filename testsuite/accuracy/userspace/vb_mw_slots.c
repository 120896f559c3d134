/*
 * vb_mw_slots.c - rendezvous receive endpoint that exposes its landing
 * slots through type-2 memory windows (libfabric verbs-provider style).
 *
 * Every slot owns a buffer that is registered once at endpoint open with
 * MW_BIND and a type-2 window.  A rendezvous request binds the slot's
 * window (IBV_WR_BIND_MW) with a fresh rkey, advertises it in an inline
 * SEND, and when the peer reports the write done the window is killed with
 * a signaled LOCAL_INV; the slot is free again on that completion.
 *
 * Two type-1 windows sit over a small counter page: a read-only "peek"
 * window for statistics and an atomic window for the peer's credit counter.
 *
 * Known problems:
 *  - slot setup unwinds with while (i--) and forgets the MR the failing
 *    iteration already registered;
 *  - the send queue reserves two entries per slot while a rendezvous posts
 *    BIND_MW, SEND and LOCAL_INV;
 *  - the atomic window is bound to the counter MR, which has no local write;
 *  - the receive ring is registered with remote write nobody is told about.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-rkey-reuse, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-transport, rdma-send-queue-manual-factor -- not the subject of this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define VBW_NSLOTS	64
#define VBW_SLOT_SIZE	(128 * 1024)
#define VBW_RX_DEPTH	128
#define VBW_MSG_SIZE	256
#define VBW_INLINE	128
#define VBW_CQ_DEPTH	(4 * VBW_NSLOTS + VBW_RX_DEPTH)

#define VBW_WRID_RECV	0x1ULL
#define VBW_WRID_INV	0x2ULL
#define VBW_WRID_BIND	0x3ULL
#define VBW_WRID_MASK	0x7ULL

enum vbw_op {
	VBW_OP_RTS = 1,		/* we -> peer: write into this window */
	VBW_OP_DONE = 2,	/* peer -> we: slot written */
};

struct vbw_msg {
	uint32_t op;
	uint32_t slot;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct vbw_slot {
	void *buf;
	struct ibv_mr *mr;
	struct ibv_mw *mw;
	uint32_t rkey;
	int busy;
	struct ibv_send_wr bind_wr;
	struct ibv_send_wr send_wr;
	struct ibv_send_wr inv_wr;
	struct ibv_sge sge;
	struct vbw_msg msg;
} __attribute__((aligned(64)));

struct vbw_ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint32_t max_inline;

	struct vbw_slot slots[VBW_NSLOTS];

	char *rx_buf;
	struct ibv_mr *rx_mr;

	uint64_t *cnt_page;
	struct ibv_mr *cnt_mr;
	struct ibv_mw *peek_mw;
	struct ibv_mw *credit_mw;
};

static int vbw_slots_init(struct vbw_ep *ep)
{
	int i;

	for (i = 0; i < VBW_NSLOTS; i++) {
		struct vbw_slot *s = &ep->slots[i];

		s->buf = aligned_alloc(4096, VBW_SLOT_SIZE);
		if (!s->buf)
			goto unwind;
		s->mr = ibv_reg_mr(ep->pd, s->buf, VBW_SLOT_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		if (!s->mr) {
			free(s->buf);
			goto unwind;	// OK: rdma-mr-leak -- the registration of slot i failed, nothing of it is held
		}
		s->mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2);
		if (!s->mw)
			goto unwind;	// BUG: rdma-mr-leak -- slot i's MR is registered but while (i--) starts below it
		s->rkey = s->mw->rkey;
		s->busy = 0;
	}
	return 0;

unwind:
	while (i--) {
		ibv_dealloc_mw(ep->slots[i].mw);
		ibv_dereg_mr(ep->slots[i].mr);
		free(ep->slots[i].buf);
	}
	return -ENOMEM;
}

static int vbw_post_recv(struct vbw_ep *ep, unsigned int idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(ep->rx_buf + (size_t)idx * VBW_MSG_SIZE),
		.length = VBW_MSG_SIZE,
		.lkey = ep->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = ((uint64_t)idx << 3) | VBW_WRID_RECV,
		.sg_list = &sge,
		.num_sge = 1,
	}, *bad;

	return ibv_post_recv(ep->qp, &wr, &bad);
}

static int vbw_rx_init(struct vbw_ep *ep)
{
	unsigned int i;
	int ret;

	ep->rx_buf = calloc(VBW_RX_DEPTH, VBW_MSG_SIZE);
	if (!ep->rx_buf)
		return -ENOMEM;
	/* peer may push small messages directly one day */
	ep->rx_mr = ibv_reg_mr(ep->pd, ep->rx_buf, VBW_RX_DEPTH * VBW_MSG_SIZE,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);	// BUG: rdma-remote-access-overbroad -- only rx_mr->lkey is ever used, the rkey is never sent
	if (!ep->rx_mr) {
		free(ep->rx_buf);
		return -errno;
	}
	for (i = 0; i < VBW_RX_DEPTH; i++) {
		ret = vbw_post_recv(ep, i);
		if (ret) {
			ibv_dereg_mr(ep->rx_mr);
			ep->rx_mr = NULL;
			free(ep->rx_buf);
			return -ret;	// OK: rdma-mr-leak -- rx_mr deregistered before the error return
		}
	}
	return 0;
}

static int vbw_counter_init(struct vbw_ep *ep)
{
	ep->cnt_page = aligned_alloc(4096, 4096);
	if (!ep->cnt_page)
		return -ENOMEM;
	memset(ep->cnt_page, 0, 4096);

	/* read by the peer through windows only, never written locally */
	ep->cnt_mr = ibv_reg_mr(ep->pd, ep->cnt_page, 4096, IBV_ACCESS_MW_BIND);
	if (!ep->cnt_mr)
		goto err_free;
	ep->peek_mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_1);
	if (!ep->peek_mw)
		goto err_mr;
	ep->credit_mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_1);
	if (!ep->credit_mw)
		goto err_peek;
	return 0;

err_peek:
	ibv_dealloc_mw(ep->peek_mw);
err_mr:
	ibv_dereg_mr(ep->cnt_mr);	/* OK: rdma-mr-leak -- both window failures unwind through the MR */
err_free:
	free(ep->cnt_page);
	return -ENOMEM;
}

/* statistics window: the peer may read the counters, nothing else */
static int vbw_export_peek(struct vbw_ep *ep, struct vbw_msg *out)
{
	struct ibv_mw_bind bind = {
		.wr_id = VBW_WRID_BIND,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = {
			.mr = ep->cnt_mr,
			.addr = (uintptr_t)ep->cnt_page,
			.length = 4096,
			.mw_access_flags = IBV_ACCESS_REMOTE_READ,	// OK: rdma-access-flags-invalid -- a read-only window needs MW_BIND on the MR, not local write
		},
	};

	if (ibv_bind_mw(ep->qp, ep->peek_mw, &bind))
		return -errno;
	out->addr = htobe64((uintptr_t)ep->cnt_page);
	out->rkey = htobe32(ep->peek_mw->rkey);
	return 0;
}

/* credit window: the peer fetch-adds the first counter word */
static int vbw_export_credit(struct vbw_ep *ep, struct vbw_msg *out)
{
	struct ibv_mw_bind bind = {
		.wr_id = VBW_WRID_BIND,
		.send_flags = IBV_SEND_SIGNALED,
	};

	bind.bind_info.mr = ep->cnt_mr;
	bind.bind_info.addr = (uintptr_t)&ep->cnt_page[0];
	bind.bind_info.length = sizeof(uint64_t);
	bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ;	// BUG: rdma-access-flags-invalid -- an atomic window needs local write on cnt_mr, registered with MW_BIND only

	if (ibv_bind_mw(ep->qp, ep->credit_mw, &bind))
		return -errno;
	out->addr = htobe64((uintptr_t)&ep->cnt_page[0]);
	out->rkey = htobe32(ep->credit_mw->rkey);
	return 0;
}

static int vbw_qp_create(struct vbw_ep *ep)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = ep->cq,
		.recv_cq = ep->cq,
		.cap = {
			/* BUG(file): rdma-send-queue-undersized -- a rendezvous keeps BIND_MW, SEND and LOCAL_INV on the queue: 3 per slot */
			.max_send_wr = 2 * VBW_NSLOTS,
			.max_recv_wr = VBW_RX_DEPTH,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = VBW_INLINE,	// OK: rdma-queue-cap-unchecked -- the granted inline size is read back from attr.cap below
		},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};

	ep->qp = ibv_create_qp(ep->pd, &attr);
	if (!ep->qp)
		return -errno;
	ep->max_inline = attr.cap.max_inline_data;
	if (ep->max_inline < sizeof(struct vbw_msg)) {
		ibv_destroy_qp(ep->qp);
		ep->qp = NULL;
		return -EOPNOTSUPP;
	}
	return 0;
}

static int vbw_post_rts(struct vbw_ep *ep, unsigned int idx, uint32_t len)
{
	struct vbw_slot *s = &ep->slots[idx];
	struct ibv_send_wr *bad;

	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	memset(&s->send_wr, 0, sizeof(s->send_wr));
	s->rkey = ibv_inc_rkey(s->rkey);
	s->bind_wr.wr_id = ((uint64_t)idx << 3) | VBW_WRID_BIND;
	s->bind_wr.opcode = IBV_WR_BIND_MW;
	s->bind_wr.send_flags = 0;	// OK: rdma-unsignaled-send-starvation -- the SEND chained behind the bind is signaled and retires it
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = s->rkey;
	s->bind_wr.bind_mw.bind_info.mr = s->mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)s->buf;
	s->bind_wr.bind_mw.bind_info.length = len;
	s->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;	// OK: rdma-access-flags-invalid -- slot MRs carry LOCAL_WRITE and MW_BIND
	s->bind_wr.next = &s->send_wr;

	s->msg.op = htobe32(VBW_OP_RTS);
	s->msg.slot = htobe32(idx);
	s->msg.addr = htobe64((uintptr_t)s->buf);
	s->msg.rkey = htobe32(s->rkey);
	s->msg.len = htobe32(len);

	s->sge.addr = (uintptr_t)&s->msg;
	s->sge.length = sizeof(s->msg);
	s->sge.lkey = 0;
	s->send_wr.wr_id = (uint64_t)idx << 3;
	s->send_wr.opcode = IBV_WR_SEND;
	s->send_wr.sg_list = &s->sge;
	s->send_wr.num_sge = 1;
	s->send_wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;

	s->busy = 1;
	if (ibv_post_send(ep->qp, &s->bind_wr, &bad)) {
		s->busy = 0;
		return -errno;
	}
	return 0;
}

static int vbw_kill_window(struct vbw_ep *ep, unsigned int idx)
{
	struct vbw_slot *s = &ep->slots[idx];
	struct ibv_send_wr *bad;

	memset(&s->inv_wr, 0, sizeof(s->inv_wr));
	s->inv_wr.wr_id = ((uint64_t)idx << 3) | VBW_WRID_INV;
	s->inv_wr.opcode = IBV_WR_LOCAL_INV;
	s->inv_wr.invalidate_rkey = s->rkey;
	s->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(ep->qp, &s->inv_wr, &bad) ? -errno : 0;
}

/* large eager sends use one bounce buffer, registered the first time it is needed */
static char *vbw_big_buf;
static struct ibv_mr *vbw_big_mr;

static int vbw_send_eager(struct vbw_ep *ep, const void *data, uint32_t len)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (!vbw_big_mr) {
		vbw_big_buf = aligned_alloc(4096, VBW_SLOT_SIZE);
		if (!vbw_big_buf)
			return -ENOMEM;
		vbw_big_mr = ibv_reg_mr(ep->pd, vbw_big_buf, VBW_SLOT_SIZE, IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-registration-in-datapath -- registered on first use and kept until close
		if (!vbw_big_mr) {
			int err = errno;

			free(vbw_big_buf);
			vbw_big_buf = NULL;
			return -err;
		}
	}
	if (len > VBW_SLOT_SIZE)
		return -EMSGSIZE;
	memcpy(vbw_big_buf, data, len);

	sge.addr = (uintptr_t)vbw_big_buf;
	sge.length = len;
	sge.lkey = vbw_big_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(ep->qp, &wr, &bad) ? -errno : 0;
}

static int vbw_progress(struct vbw_ep *ep)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(ep->cq, 16, wc);
	for (i = 0; i < n; i++) {
		unsigned int idx = (unsigned int)(wc[i].wr_id >> 3);

		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		switch (wc[i].wr_id & VBW_WRID_MASK) {
		case VBW_WRID_RECV: {
			struct vbw_msg *m = (struct vbw_msg *)(ep->rx_buf + (size_t)idx * VBW_MSG_SIZE);

			if (be32toh(m->op) == VBW_OP_DONE && be32toh(m->slot) < VBW_NSLOTS)
				vbw_kill_window(ep, be32toh(m->slot));
			vbw_post_recv(ep, idx);
			break;
		}
		case VBW_WRID_INV:
			ep->slots[idx].busy = 0;
			break;
		default:
			break;
		}
	}
	return n;
}

static void vbw_slots_fini(struct vbw_ep *ep)
{
	for (int i = 0; i < VBW_NSLOTS; i++) {
		ibv_dealloc_mw(ep->slots[i].mw);
		ibv_dereg_mr(ep->slots[i].mr);
		free(ep->slots[i].buf);
	}
}

static void vbw_ep_close(struct vbw_ep *ep)
{
	ibv_destroy_qp(ep->qp);
	vbw_slots_fini(ep);
	ibv_dealloc_mw(ep->credit_mw);
	ibv_dealloc_mw(ep->peek_mw);
	ibv_dereg_mr(ep->cnt_mr);
	free(ep->cnt_page);
	ibv_dereg_mr(ep->rx_mr);	// OK: rdma-registration-in-datapath -- endpoint teardown, once, after the run loop
	free(ep->rx_buf);
	if (vbw_big_mr) {
		ibv_dereg_mr(vbw_big_mr);
		vbw_big_mr = NULL;
	}
	free(vbw_big_buf);
	ibv_destroy_cq(ep->cq);
	ibv_dealloc_pd(ep->pd);
}

int vbw_ep_open(struct vbw_ep *ep, struct ibv_context *ctx)
{
	int ret;

	memset(ep, 0, sizeof(*ep));
	ep->ctx = ctx;
	ep->pd = ibv_alloc_pd(ctx);
	if (!ep->pd)
		return -errno;
	ep->cq = ibv_create_cq(ctx, VBW_CQ_DEPTH, NULL, NULL, 0);
	if (!ep->cq) {
		ret = -errno;
		goto err_pd;
	}
	ret = vbw_qp_create(ep);
	if (ret)
		goto err_cq;
	ret = vbw_slots_init(ep);
	if (ret)
		goto err_qp;
	ret = vbw_rx_init(ep);
	if (ret)
		goto err_slots;
	ret = vbw_counter_init(ep);
	if (ret)
		goto err_rx;
	return 0;

err_rx:
	ibv_dereg_mr(ep->rx_mr);
	free(ep->rx_buf);
err_slots:
	vbw_slots_fini(ep);
err_qp:
	ibv_destroy_qp(ep->qp);
err_cq:
	ibv_destroy_cq(ep->cq);
err_pd:
	ibv_dealloc_pd(ep->pd);
	return ret;
}

int vbw_ep_advertise(struct vbw_ep *ep, struct vbw_msg *peek, struct vbw_msg *credit)
{
	int ret = vbw_export_peek(ep, peek);

	return ret ? ret : vbw_export_credit(ep, credit);
}

int vbw_ep_run(struct vbw_ep *ep, const void *hdr, uint32_t hdr_len)
{
	unsigned int i;
	int ret;

	ret = vbw_send_eager(ep, hdr, hdr_len);
	if (ret)
		return ret;
	for (i = 0; i < VBW_NSLOTS; i++) {
		ret = vbw_post_rts(ep, i, VBW_SLOT_SIZE);
		if (ret)
			return ret;
	}
	while ((ret = vbw_progress(ep)) >= 0)
		;
	vbw_ep_close(ep);
	return ret;
}
