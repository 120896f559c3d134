/*
 * rd_frame_relay.c - RDMA video frame relay (one upstream camera, N subscribers)
 *
 * Ingest: the camera node RDMA-WRITEs encoded frames into our ingest ring;
 * the ring's rkey (and the thumbnail area's rkey) are advertised once in the
 * HELLO control message.  Per-frame descriptors and the sidecar (audio,
 * captions) are pulled from the camera with RDMA READ.
 *
 * Egress: frames are pushed round-robin to subscribers (transcoding
 * workers) with RDMA WRITE WITH IMM.  A frame comes either from the relay's
 * own slab pool (registered once at start-up), straight out of the ingest
 * ring, or is a passthrough frame handed to us by the decoder library in
 * memory we do not own; passthrough frames are registered on demand and
 * deregistered when the WRITE completes.
 *
 * Correct: the slab pool and its unwinding, the dereg-before-free order of
 * the thumbnail area, the pool teardown (local-only keys).  Wrong: see the
 * BUG annotations (setup ladder, per-frame registration, thumbnail flags,
 * the iWARP special case, the sidecar READ sink, the ingest teardown).
 *
 * NOT-ANNOTATED: rdma-queue-cap-unchecked, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#define FR_POOL_SLABS		16
#define FR_SLAB_SIZE		(4u << 20)
#define FR_INGEST_SIZE		(64u << 20)
#define FR_THUMB_SIZE		(2u << 20)
#define FR_META_SIZE		4096
#define FR_CTRL_SLOTS		32
#define FR_CTRL_MSG		256
#define FR_MAX_SUBS		8

enum { FR_WR_PUSH = 1, FR_WR_META, FR_WR_SIDECAR, FR_WR_CTRL_SEND, FR_WR_CTRL_RECV };

#define FR_WRID(kind, idx)	(((uint64_t)(kind) << 32) | (uint32_t)(idx))
#define FR_WRID_KIND(id)	((int)((id) >> 32))
#define FR_WRID_IDX(id)		((uint32_t)(id))

struct fr_hello {
	uint64_t ingest_addr;
	uint64_t thumb_addr;
	uint32_t ingest_rkey;
	uint32_t thumb_rkey;
	uint32_t ingest_len;
	uint32_t thumb_len;
};

struct fr_pool {
	void		*slab[FR_POOL_SLABS];
	struct ibv_mr	*mr[FR_POOL_SLABS];
	uint32_t	 free_mask;
};

struct fr_frame {
	void		*data;
	size_t		 len;
	int		 slab;		/* >= 0: pool slab, -1: ingest ring, -2: passthrough */
	struct ibv_mr	*mr;		/* passthrough registration */
	uint32_t	 seq;
};

struct fr_sub {
	uint64_t	 raddr;
	uint32_t	 rkey;
	uint32_t	 slot_size;
	uint32_t	 inflight;
};

struct fr_conn {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_device_attr	 dattr;

	void			*ingest_ring;
	struct ibv_mr		*ingest_mr;
	void			*thumb_buf;
	struct ibv_mr		*thumb_mr;
	void			*meta_buf;
	struct ibv_mr		*meta_mr;
	char			*ctrl_buf;
	struct ibv_mr		*ctrl_mr;

	uint64_t		 cam_meta_addr;
	uint32_t		 cam_meta_rkey;
	uint32_t		 read_sge_max;

	struct fr_pool		 pool;
	struct fr_sub		 subs[FR_MAX_SUBS];
	struct fr_frame		*inflight[1024];
};

/* Provided by the decoder glue (fr_decoder.c). */
extern struct fr_frame *fr_decoder_next(uint64_t *sidecar_addr, uint32_t *sidecar_rkey,
					uint32_t *sidecar_len);

static int fr_pool_init(struct fr_conn *c, struct fr_pool *p, int nslabs)
{
	int i;

	for (i = 0; i < nslabs; i++) {
		p->slab[i] = aligned_alloc(4096, FR_SLAB_SIZE);
		if (!p->slab[i])
			goto unwind;
		p->mr[i] = ibv_reg_mr(c->pd, p->slab[i], FR_SLAB_SIZE, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- slab lkeys address the relay's own RDMA WRITEs and the sidecar READ */ /* OK: rdma-registration-in-datapath -- the pool is registered once at start-up */
		if (!p->mr[i]) {
			free(p->slab[i]);
			goto unwind;
		}
	}
	p->free_mask = (nslabs == 32) ? ~0u : ((1u << nslabs) - 1);
	return 0;

unwind:
	while (i--) {	/* OK: rdma-mr-leak -- element i was never registered (or its buffer freed above), all below it are deregistered */
		ibv_dereg_mr(p->mr[i]);
		free(p->slab[i]);
	}
	return -ENOMEM;
}

static void fr_pool_fini(struct fr_pool *p, int nslabs)
{
	int i;

	for (i = 0; i < nslabs; i++) {
		free(p->slab[i]);	/* OK: rdma-invalidation-leak -- local-only registration, no key was handed out */
		ibv_dereg_mr(p->mr[i]);	/* OK: rdma-registration-in-datapath -- teardown of the whole table */
	}
}

static int fr_post_ctrl_recv(struct fr_conn *c, int slot);

static int fr_conn_setup(struct fr_conn *c)
{
	int meta_access, i;

	if (ibv_query_device(c->ctx, &c->dattr))
		return -errno;

	/* Some RNICs cap READ scatter at one entry. */
	c->read_sge_max = c->dattr.max_sge_rd ? c->dattr.max_sge_rd : 1;
	if (c->ctx->device->transport_type == IBV_TRANSPORT_IWARP) /* OK: rdma-access-flags-transport -- sizing only, no access flags decided here */
		c->read_sge_max = 1;

	c->ingest_ring = aligned_alloc(4096, FR_INGEST_SIZE);
	if (!c->ingest_ring)
		return -ENOMEM;
	c->ingest_mr = ibv_reg_mr(c->pd, c->ingest_ring, FR_INGEST_SIZE,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-access-flags-invalid -- remote write with local write */ /* BUG: rdma-local-mr-management -- rkey is advertised to the camera in HELLO */
	if (!c->ingest_mr)
		goto err_ingest_buf;

	c->thumb_buf = aligned_alloc(4096, FR_THUMB_SIZE);
	if (!c->thumb_buf)
		goto err_ingest_mr;
	c->thumb_mr = ibv_reg_mr(c->pd, c->thumb_buf, FR_THUMB_SIZE,
				 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE); /* BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE, registration fails with EINVAL */ /* BUG: rdma-local-mr-management -- rkey is advertised in HELLO */
	if (!c->thumb_mr)
		goto err_thumb_buf;

	c->meta_buf = aligned_alloc(4096, FR_META_SIZE);
	if (!c->meta_buf)
		goto err_thumb_mr;
	meta_access = IBV_ACCESS_LOCAL_WRITE;
	if (c->ctx->device->transport_type == IBV_TRANSPORT_IWARP)
		meta_access |= IBV_ACCESS_REMOTE_WRITE;	/* BUG: rdma-access-flags-transport -- access flags chosen by an inline iWARP test */
	c->meta_mr = ibv_reg_mr(c->pd, c->meta_buf, FR_META_SIZE, meta_access); /* BUG: rdma-local-mr-management -- lkey is the sink of the relay's own RDMA READ */ /* OK: rdma-access-flags-invalid -- LOCAL_WRITE always set */
	if (!c->meta_mr)
		goto err_meta_buf;

	c->ctrl_buf = calloc(FR_CTRL_SLOTS + 1, FR_CTRL_MSG);
	if (!c->ctrl_buf)
		goto err_meta_mr;
	c->ctrl_mr = ibv_reg_mr(c->pd, c->ctrl_buf, (FR_CTRL_SLOTS + 1) * FR_CTRL_MSG,
				IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- control ring, registered once for local SEND/RECV only */
	if (!c->ctrl_mr)
		goto err_ctrl_buf;

	if (fr_pool_init(c, &c->pool, FR_POOL_SLABS))
		goto err_ctrl_buf;	/* BUG: rdma-mr-leak -- jumps past the ctrl_mr deregistration; c->ctrl_mr stays registered on this error return */

	for (i = 0; i < FR_CTRL_SLOTS; i++)
		if (fr_post_ctrl_recv(c, i))
			goto err_pool;
	return 0;

err_pool:
	fr_pool_fini(&c->pool, FR_POOL_SLABS);
	ibv_dereg_mr(c->ctrl_mr);
err_ctrl_buf:
	free(c->ctrl_buf);
err_meta_mr:
	ibv_dereg_mr(c->meta_mr);
err_meta_buf:
	free(c->meta_buf);
err_thumb_mr:
	ibv_dereg_mr(c->thumb_mr);
err_thumb_buf:
	free(c->thumb_buf);
err_ingest_mr:
	ibv_dereg_mr(c->ingest_mr);
err_ingest_buf:
	free(c->ingest_ring);
	return -ENOMEM;
}

static int fr_post_ctrl_recv(struct fr_conn *c, int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->ctrl_buf + (slot + 1) * FR_CTRL_MSG),
		.length = FR_CTRL_MSG,
		.lkey = c->ctrl_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = FR_WRID(FR_WR_CTRL_RECV, slot), .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

static int fr_send_hello(struct fr_conn *c)
{
	struct fr_hello *h = (struct fr_hello *)c->ctrl_buf;
	struct ibv_sge sge = { .addr = (uintptr_t)h, .length = sizeof(*h), .lkey = c->ctrl_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = FR_WRID(FR_WR_CTRL_SEND, 0),
		.sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad;

	h->ingest_addr = (uintptr_t)c->ingest_ring;
	h->ingest_rkey = htonl(c->ingest_mr->rkey);
	h->ingest_len = htonl(FR_INGEST_SIZE);
	h->thumb_addr = (uintptr_t)c->thumb_buf;
	h->thumb_rkey = htonl(c->thumb_mr->rkey);
	h->thumb_len = htonl(FR_THUMB_SIZE);
	return ibv_post_send(c->qp, &wr, &bad);
}

/* Pull the descriptor of frame @seq from the camera's descriptor table. */
static int fr_fetch_meta(struct fr_conn *c, uint32_t seq)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->meta_buf, .length = 64, .lkey = c->meta_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = FR_WRID(FR_WR_META, seq),
		.sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad;

	wr.wr.rdma.remote_addr = c->cam_meta_addr + (uint64_t)(seq % 1024) * 64;
	wr.wr.rdma.rkey = c->cam_meta_rkey;
	return ibv_post_send(c->qp, &wr, &bad); /* OK: rdma-access-flags-transport -- the meta sink gets REMOTE_WRITE on iWARP */
}

/* Sidecar (audio/captions) lands in the tail of the frame's pool slab. */
static int fr_fetch_sidecar(struct fr_conn *c, struct fr_frame *f, uint64_t raddr,
			    uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (f->slab < 0 || f->len + len > FR_SLAB_SIZE)
		return -EINVAL;
	sge.addr = (uintptr_t)c->pool.slab[f->slab] + f->len;
	sge.length = len;
	sge.lkey = c->pool.mr[f->slab]->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = FR_WRID(FR_WR_SIDECAR, f->seq);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(c->qp, &wr, &bad); /* BUG: rdma-access-flags-transport -- READ sink is a pool slab registered LOCAL_WRITE only; fails on iWARP */
}

static struct ibv_mr *fr_reg_passthrough(struct fr_conn *c, struct fr_frame *f)
{
	struct ibv_mr *mr;

	mr = ibv_reg_mr(c->pd, f->data, f->len, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-registration-in-datapath -- one registration per pushed frame */ /* BUG: rdma-local-mr-management -- per-frame registration as a WRITE source */
	if (!mr)
		fprintf(stderr, "relay: cannot pin passthrough frame %u: %s\n", f->seq, strerror(errno));
	return mr;	/* OK: rdma-mr-leak -- handed to the caller */
}

static int fr_push_frame(struct fr_conn *c, int sub_idx, struct fr_frame *f)
{
	struct fr_sub *s = &c->subs[sub_idx];
	struct ibv_mr *mr = NULL;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	sge.addr = (uintptr_t)f->data;
	sge.length = (uint32_t)f->len;
	if (f->slab >= 0) {
		sge.lkey = c->pool.mr[f->slab]->lkey;	/* OK: rdma-registration-in-datapath -- pre-registered pool */
	} else if (f->slab == -1) {
		sge.lkey = c->ingest_mr->lkey;
	} else {
		mr = fr_reg_passthrough(c, f);
		if (!mr)
			return -ENOMEM;
		sge.lkey = mr->lkey;
	}

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = FR_WRID(FR_WR_PUSH, f->seq % 1024);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl(f->seq);
	wr.wr.rdma.remote_addr = s->raddr + (uint64_t)(f->seq % 64) * s->slot_size;
	wr.wr.rdma.rkey = s->rkey;

	if (ibv_post_send(c->qp, &wr, &bad)) {
		fprintf(stderr, "relay: push of frame %u to sub %d failed\n", f->seq, sub_idx);
		return -EIO;	/* BUG: rdma-mr-leak -- the passthrough registration is dropped on a failed post */
	}
	f->mr = mr;
	c->inflight[f->seq % 1024] = f;
	s->inflight++;
	return 0;
}

static void fr_handle_wc(struct fr_conn *c, struct ibv_wc *wc)
{
	struct fr_frame *f;
	uint32_t idx = FR_WRID_IDX(wc->wr_id);

	switch (FR_WRID_KIND(wc->wr_id)) {
	case FR_WR_PUSH:
		f = c->inflight[idx];
		c->inflight[idx] = NULL;
		if (!f)
			break;
		if (f->slab == -2 && f->mr) {
			ibv_dereg_mr(f->mr);	/* BUG: rdma-registration-in-datapath -- deregistration per completed frame */ /* OK: rdma-mr-leak -- released before the pointer is cleared */
			f->mr = NULL;
		} else if (f->slab >= 0) {
			c->pool.free_mask |= 1u << f->slab;
		}
		break;
	case FR_WR_CTRL_RECV:
		if (wc->status == IBV_WC_SUCCESS)
			fr_post_ctrl_recv(c, (int)idx);
		break;
	default:
		if (wc->status != IBV_WC_SUCCESS)
			fprintf(stderr, "relay: wr %#llx failed: %s\n",
				(unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status));
		break;
	}
}

static int fr_poll(struct fr_conn *c)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (i = 0; i < n; i++)
		fr_handle_wc(c, &wc[i]);
	return n;
}

static void fr_conn_teardown(struct fr_conn *c)
{
	fr_pool_fini(&c->pool, FR_POOL_SLABS);

	ibv_dereg_mr(c->ctrl_mr);
	free(c->ctrl_buf);

	ibv_dereg_mr(c->meta_mr);
	free(c->meta_buf);

	ibv_dereg_mr(c->thumb_mr);
	free(c->thumb_buf);	/* OK: rdma-invalidation-leak -- the thumbnail key died with the dereg above */

	free(c->ingest_ring);	/* BUG: rdma-invalidation-leak -- the camera still holds a valid rkey for the ring; it is deregistered only after the free */
	ibv_dereg_mr(c->ingest_mr);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct fr_conn c;
	uint64_t sc_addr;
	uint32_t sc_rkey, sc_len;
	int i, n, s;

	(void)argc;
	(void)argv;
	memset(&c, 0, sizeof(c));
	list = ibv_get_device_list(&n);
	if (!list || !n)
		return 1;
	c.ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!c.ctx)
		return 1;
	c.pd = ibv_alloc_pd(c.ctx);
	c.cq = ibv_create_cq(c.ctx, 1024, NULL, NULL, 0);
	if (!c.pd || !c.cq)
		return 1;
	{
		struct ibv_qp_init_attr qa = {
			.send_cq = c.cq, .recv_cq = c.cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 512, .max_recv_wr = FR_CTRL_SLOTS,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		c.qp = ibv_create_qp(c.pd, &qa);
		if (!c.qp)
			return 1;
	}
	if (fr_conn_setup(&c))
		return 1;
	if (fr_send_hello(&c))
		goto out;
	for (i = 0; i < 100000; i++) {
		struct fr_frame *f = fr_decoder_next(&sc_addr, &sc_rkey, &sc_len);

		if (!f)
			break;
		fr_fetch_meta(&c, f->seq);
		if (sc_len && fr_fetch_sidecar(&c, f, sc_addr, sc_rkey, sc_len))
			fprintf(stderr, "relay: sidecar of %u dropped\n", f->seq);
		/* workers of the transcoding farm take frames round-robin */
		s = (int)(f->seq % FR_MAX_SUBS);
		if (c.subs[s].rkey)
			fr_push_frame(&c, s, f);
		while (fr_poll(&c) > 0)
			;
	}
out:
	fr_conn_teardown(&c);
	ibv_destroy_qp(c.qp);
	ibv_destroy_cq(c.cq);
	ibv_dealloc_pd(c.pd);
	ibv_close_device(c.ctx);
	return 0;
}
