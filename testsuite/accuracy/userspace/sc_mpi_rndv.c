/*
 * sc_mpi_rndv.c - mpx: point-to-point and one-sided transport of a small MPI
 * runtime over verbs RC.
 *
 * Messages up to MPX_EAGER_SIZE are copied through pre-registered eager
 * buffers. Larger messages use a read-based rendezvous (RGET): the sender
 * registers the user buffer through the registration cache and sends an RTS
 * carrying its address and rkey; the receiver RDMA READs the payload into
 * the matched user buffer (also from the cache) and answers with a FIN.
 * An RTS that arrives before its receive is posted is pulled into a
 * temporary buffer. Windows for MPI_Win_create register the window memory
 * and publish the rkey to all ranks.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-rkey-reuse,
 *   rdma-send-queue-undersized, rdma-send-queue-manual-factor,
 *   rdma-unsignaled-send-starvation, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked -- not reviewed for this file
 */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define MPX_EAGER_SIZE   8192
#define MPX_EAGER_BUFS   256
#define MPX_SQ_DEPTH     2048
#define MPX_RQ_DEPTH     1024
#define MPX_RCACHE_MAX   64

enum { MPX_MSG_EAGER = 1, MPX_MSG_RTS, MPX_MSG_FIN };
enum mpx_win_flavor { MPX_WIN_RDONLY, MPX_WIN_ATOMIC, MPX_WIN_DEFAULT };

struct mpx_hdr { uint32_t type; uint32_t len; uint64_t tag; };
struct mpx_rts { struct mpx_hdr h; uint64_t addr; uint64_t sreq; uint32_t rkey; uint32_t pad; };

struct mpx_req {
	void          *buf;
	size_t         len;
	uint64_t       tag;
	uint64_t       sreq;	/* sender's request, echoed in FIN */
	struct ibv_mr *tmp_mr;	/* unexpected RTS staging */
	void          *tmp;
	struct mpx_rcache_ent *reg;
	int            done;
};

struct mpx_eager {
	char          *data;
	struct ibv_mr *mr;
	struct mpx_req *req;
};

struct mpx_rcache_ent {
	uintptr_t      start, end;
	struct ibv_mr *mr;
	int            refcnt;
	unsigned long  stamp;
};

struct mpx_dev {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	char               *slab;
	struct mpx_eager    eager[MPX_EAGER_BUFS];
	struct mpx_rcache_ent *rcache[MPX_RCACHE_MAX];
	unsigned long       clock;
};

struct mpx_win {
	struct mpx_dev *dev;
	void           *base;
	size_t          size;
	struct ibv_mr  *mr;
	uint32_t       *peer_rkeys;
};

struct mpx_win_info { uint64_t base; uint64_t size; uint32_t rkey; };

struct mpx_req *mpx_match_posted(struct mpx_dev *d, uint64_t tag);
struct mpx_req *mpx_unexp_push(struct mpx_dev *d, const struct mpx_rts *rts);
int mpx_comm_size(void);

static struct mpx_rcache_ent *mpx_rcache_get(struct mpx_dev *d, void *buf, size_t len)
{
	uintptr_t s = (uintptr_t)buf, e = s + len;
	bool iwarp = d->ctx->device->transport_type == IBV_TRANSPORT_IWARP;
	struct mpx_rcache_ent *ent;
	struct ibv_mr *mr;
	int i, slot = -1;

	for (i = 0; i < MPX_RCACHE_MAX; i++) {
		ent = d->rcache[i];
		if (!ent) {
			if (slot < 0)
				slot = i;
			continue;
		}
		if (ent->start <= s && e <= ent->end) {
			ent->refcnt++;
			ent->stamp = ++d->clock;
			return ent;
		}
		if (!ent->refcnt && (slot < 0 || (d->rcache[slot] && ent->stamp < d->rcache[slot]->stamp)))
			slot = i;
	}
	if (slot < 0)
		return NULL;	/* everything pinned by in-flight rendezvous */

	/* OK: rdma-remote-access-overbroad -- the rkey travels in the RTS */
	/* OK: rdma-registration-in-datapath -- registered only on a cache miss */
	mr = ibv_reg_mr(d->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | (iwarp ? IBV_ACCESS_REMOTE_WRITE : 0)); /* BUG: rdma-access-flags-transport, rdma-local-mr-management -- READ-sink rights chosen by an inline iWARP test; key goes to the peer */
	if (!mr)
		return NULL;
	ent = d->rcache[slot];
	if (ent) {
		ibv_dereg_mr(ent->mr); /* OK: rdma-registration-in-datapath -- evicts the least recently used idle entry on a miss */
	} else {
		ent = calloc(1, sizeof(*ent));
		if (!ent)
			return NULL; /* BUG: rdma-mr-leak -- the new registration is dropped */
		d->rcache[slot] = ent;
	}
	ent->mr = mr; /* OK: rdma-mr-leak -- the victim's MR was deregistered above */
	ent->start = s;
	ent->end = e;
	ent->refcnt = 1;
	ent->stamp = ++d->clock;
	return ent;
}

static void mpx_rcache_put(struct mpx_rcache_ent *ent)
{
	ent->refcnt--;
}

static int mpx_post_ctrl(struct mpx_dev *d, struct mpx_eager *eb, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)eb->data, len, eb->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = (uintptr_t)eb, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	return ibv_post_send(d->qp, &wr, &bad);
}

static int mpx_post_get(struct mpx_dev *d, struct mpx_req *r, const struct mpx_rts *rts,
			void *dst, uint32_t lkey)
{
	struct ibv_sge sge = { (uintptr_t)dst, be32toh(rts->h.len), lkey };
	struct ibv_send_wr wr = {0}, *bad;

	wr.wr_id = (uintptr_t)r;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = be64toh(rts->addr);
	wr.wr.rdma.rkey = be32toh(rts->rkey);
	return ibv_post_send(d->qp, &wr, &bad);
}

int mpx_isend(struct mpx_dev *d, struct mpx_eager *eb, struct mpx_req *req)
{
	struct mpx_hdr *h = (struct mpx_hdr *)eb->data;
	struct mpx_rts *rts = (struct mpx_rts *)eb->data;

	if (req->len + sizeof(*h) <= MPX_EAGER_SIZE) {
		h->type = htobe32(MPX_MSG_EAGER);
		h->len = htobe32((uint32_t)req->len);
		h->tag = htobe64(req->tag);
		memcpy(h + 1, req->buf, req->len);
		return mpx_post_ctrl(d, eb, (uint32_t)(sizeof(*h) + req->len));
	}
	req->reg = mpx_rcache_get(d, req->buf, req->len);
	if (!req->reg)
		return -EAGAIN;
	rts->h.type = htobe32(MPX_MSG_RTS);
	rts->h.len = htobe32((uint32_t)req->len);
	rts->h.tag = htobe64(req->tag);
	rts->addr = htobe64((uintptr_t)req->buf);
	rts->sreq = htobe64((uintptr_t)req);
	rts->rkey = htobe32(req->reg->mr->rkey);
	return mpx_post_ctrl(d, eb, sizeof(*rts));
}

/* RTS arrived on the receive queue. */
void mpx_handle_rts(struct mpx_dev *d, struct ibv_wc *wc)
{
	struct mpx_eager *eb = (struct mpx_eager *)(uintptr_t)wc->wr_id;
	struct mpx_rts *rts = (struct mpx_rts *)eb->data;
	struct mpx_req *r;

	r = mpx_match_posted(d, be64toh(rts->h.tag));
	if (r) {
		r->reg = mpx_rcache_get(d, r->buf, be32toh(rts->h.len));
		if (!r->reg)
			return;
		r->sreq = rts->sreq;
		mpx_post_get(d, r, rts, r->buf, r->reg->mr->lkey); /* OK: rdma-access-flags-transport -- the cache grants REMOTE_WRITE on iWARP */
		return;
	}

	r = mpx_unexp_push(d, rts);
	if (!r)
		return;
	r->tmp = malloc(be32toh(rts->h.len));
	if (!r->tmp)
		return;
	r->tmp_mr = ibv_reg_mr(d->pd, r->tmp, be32toh(rts->h.len), IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a registration per unexpected message */
	if (!r->tmp_mr)
		return;
	r->sreq = rts->sreq;
	mpx_post_get(d, r, rts, r->tmp, r->tmp_mr->lkey); /* BUG: rdma-access-flags-transport -- the staging buffer is a READ sink without REMOTE_WRITE */
}

/* RDMA READ of a rendezvous payload completed: release and send FIN. */
void mpx_handle_get_done(struct mpx_dev *d, struct ibv_wc *wc, struct mpx_eager *eb)
{
	struct mpx_req *r = (struct mpx_req *)(uintptr_t)wc->wr_id;
	struct mpx_hdr *fin = (struct mpx_hdr *)eb->data;

	if (r->tmp_mr) {
		ibv_dereg_mr(r->tmp_mr); /* BUG: rdma-registration-in-datapath -- deregistration per unexpected message */
		r->tmp_mr = NULL;
	} else if (r->reg) {
		mpx_rcache_put(r->reg);
		r->reg = NULL;
	}
	r->done = wc->status == IBV_WC_SUCCESS ? 1 : -1;
	fin->type = htobe32(MPX_MSG_FIN);
	fin->len = 0;
	fin->tag = r->sreq;
	mpx_post_ctrl(d, eb, sizeof(*fin));
}

struct mpx_win *mpx_win_create(struct mpx_dev *d, void *base, size_t size,
			       enum mpx_win_flavor flavor)
{
	struct mpx_win *w;
	int access;

	switch (flavor) {
	case MPX_WIN_RDONLY:
		access = IBV_ACCESS_REMOTE_READ;
		break;
	case MPX_WIN_ATOMIC:
		access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_ATOMIC;
		break;
	default:
		access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			 IBV_ACCESS_REMOTE_WRITE;
		break;
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->dev = d;
	w->base = base;
	w->size = size;
	/* OK: rdma-remote-access-overbroad -- the rkey is published by mpx_win_info() */
	w->mr = ibv_reg_mr(d->pd, base, size, access); /* BUG: rdma-access-flags-invalid, rdma-local-mr-management -- the atomic flavor asks REMOTE_WRITE|REMOTE_ATOMIC without LOCAL_WRITE; key exposed to all ranks */
	if (!w->mr)
		goto err_free;
	w->peer_rkeys = calloc(mpx_comm_size(), sizeof(uint32_t));
	if (!w->peer_rkeys)
		goto err_mr;
	return w;

err_mr:
	ibv_dereg_mr(w->mr);
err_free:
	free(w);
	return NULL; /* OK: rdma-mr-leak -- err_mr released the window registration */
}

void mpx_win_info(const struct mpx_win *w, struct mpx_win_info *info)
{
	info->base = htobe64((uintptr_t)w->base);
	info->size = htobe64(w->size);
	info->rkey = htobe32(w->mr->rkey);
}

void mpx_win_free(struct mpx_win *w)
{
	ibv_dereg_mr(w->mr);
	free(w->peer_rkeys);
	free(w);
}

int mpx_dev_init(struct mpx_dev *d)
{
	struct ibv_qp_init_attr qia = {0};
	int i, j;

	d->slab = aligned_alloc(4096, (size_t)MPX_EAGER_BUFS * MPX_EAGER_SIZE);
	if (!d->slab)
		return -ENOMEM;
	for (i = 0; i < MPX_EAGER_BUFS; i++) {
		struct mpx_eager *eb = &d->eager[i];

		eb->data = d->slab + (size_t)i * MPX_EAGER_SIZE;
		/* OK: rdma-access-flags-invalid -- LOCAL_WRITE is present */
		/* BUG: rdma-remote-access-overbroad -- eager buffers' rkeys are never sent; REMOTE_WRITE is unusable */
		eb->mr = ibv_reg_mr(d->pd, eb->data, MPX_EAGER_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-local-mr-management -- bounce buffers registered once for SEND/RECV */
		if (!eb->mr)
			goto unwind;
		eb->req = calloc(1, sizeof(*eb->req));
		if (!eb->req)
			goto unwind; /* BUG: rdma-mr-leak -- the unwinding stops below i; eager[i].mr stays registered */
	}

	d->cq = ibv_create_cq(d->ctx, MPX_SQ_DEPTH + MPX_RQ_DEPTH, NULL, NULL, 0);
	if (!d->cq)
		goto unwind;
	qia.send_cq = d->cq;
	qia.recv_cq = d->cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = MPX_SQ_DEPTH; /* BUG: rdma-queue-cap-unchecked -- 2048 send WRs without looking at max_qp_wr */
	qia.cap.max_recv_wr = MPX_RQ_DEPTH; /* OK: rdma-queue-cap-unchecked -- 1024 is accepted by every device */
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	d->qp = ibv_create_qp(d->pd, &qia);
	if (!d->qp) {
		ibv_destroy_cq(d->cq);
		goto unwind;
	}
	return 0;

unwind:
	for (j = 0; j < i; j++) {
		ibv_dereg_mr(d->eager[j].mr);
		free(d->eager[j].req);
	}
	free(d->slab);
	return -ENOMEM;
}

void mpx_dev_fini(struct mpx_dev *d)
{
	int i;

	ibv_destroy_qp(d->qp);
	ibv_destroy_cq(d->cq);
	for (i = 0; i < MPX_RCACHE_MAX; i++) {
		if (!d->rcache[i])
			continue;
		ibv_dereg_mr(d->rcache[i]->mr);
		free(d->rcache[i]);
	}
	for (i = 0; i < MPX_EAGER_BUFS; i++) {
		ibv_dereg_mr(d->eager[i].mr);
		free(d->eager[i].req);
	}
	free(d->slab);
}
