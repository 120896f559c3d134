/*
 * tc_mpi_rndv.c - point-to-point rendezvous and dynamic RMA windows of a
 * small MPI-style runtime over RC verbs (openib-btl / ch3 flavour).
 *
 * Eager messages are copied through a bounce pool registered at init and
 * moved with SEND/RECV.  Every peer also gets an RDMA fast-path ring and a
 * credit word that the peer writes into directly; their keys travel in the
 * connection info exchanged at startup.  Large messages use RGET: the sender
 * pins its buffer through a registration cache and sends an RTS with
 * (addr, len, rkey); the receiver RDMA-READs into the user buffer and
 * answers with FIN.  Dynamic windows (MPI_Win_attach) expose attached
 * regions through type-2 memory windows allocated with the window.
 *
 * Known problems: the eager pool is registered with remote write that no
 * peer can use, fast-path setup loses the current peer's ring when its
 * credit word fails to register, the receiver pins every RGET sink per
 * message, and attaching a segment again binds its window under the key of
 * the previous attachment.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed in this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define RDV_EAGER_SIZE		8192
#define RDV_EAGER_COUNT		256
#define RDV_FP_SLOTS		32
#define RDV_RCACHE_SIZE		128
#define RDV_MAX_DYN_SEGS	16
#define RDV_CQ_DEPTH		1024

#define MPI_SUCCESS		0
#define MPI_ERR_NO_MEM		1
#define MPI_ERR_OTHER		2
#define MPI_ERR_INTERN		3

enum rdv_msg_type { RDV_MSG_EAGER = 1, RDV_MSG_RTS, RDV_MSG_FIN };

struct rdv_hdr {
	uint8_t		type;
	uint8_t		pad[3];
	uint32_t	tag;
	uint64_t	req_id;
};

struct rdv_rts {
	struct rdv_hdr	hdr;
	uint64_t	addr;
	uint64_t	len;
	uint32_t	rkey;
};

struct rdv_reg {
	uintptr_t	base;
	size_t		len;
	int		access;
	struct ibv_mr	*mr;
	int		refcnt;
	uint64_t	stamp;
};

struct rdv_conn_info {
	uint32_t	qpn;
	uint16_t	lid;
	uint64_t	fp_addr;
	uint32_t	fp_rkey;
	uint64_t	cr_addr;
	uint32_t	cr_rkey;
};

struct rdv_peer {
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	char			*fp_ring;
	struct ibv_mr		*fp_mr;
	uint64_t		*credit;
	struct ibv_mr		*cr_mr;
	struct rdv_conn_info	local_info;
	struct rdv_conn_info	remote_info;
};

struct rdv_req {
	uint64_t	id;
	int		peer;
	void		*ubuf;
	size_t		len;
	struct rdv_reg	*reg;		/* sender: cached pin of the source */
	struct ibv_mr	*sink_mr;	/* receiver: sink of the RGET */
	uint64_t	remote_id;
	int		done;
};

struct rdv_dyn_seg {
	struct ibv_mw	*mw;
	uint32_t	rkey;
	struct rdv_reg	*reg;
	void		*base;
	size_t		size;
	int		attached;
};

struct rdv_win {
	int			peer;
	struct rdv_dyn_seg	seg[RDV_MAX_DYN_SEGS];
};

static struct ibv_pd *g_pd;
static struct ibv_cq *g_cq;
static char *g_eager_pool;
static struct ibv_mr *g_eager_mr;
static unsigned int g_eager_next;
static struct rdv_reg g_rcache[RDV_RCACHE_SIZE];
static uint64_t g_rcache_clock;
static struct rdv_peer *g_peers;
static int g_npeers;

int rdv_init(struct ibv_context *ctx)
{
	g_pd = ibv_alloc_pd(ctx);
	if (!g_pd)
		return MPI_ERR_INTERN;
	g_eager_pool = aligned_alloc(4096, RDV_EAGER_SIZE * RDV_EAGER_COUNT);
	if (!g_eager_pool)
		return MPI_ERR_NO_MEM;
	/* OK: rdma-local-mr-management -- bounce pool registered once; its lkey only addresses sends and receives */
	g_eager_mr = ibv_reg_mr(g_pd, g_eager_pool, RDV_EAGER_SIZE * RDV_EAGER_COUNT, // BUG: rdma-remote-access-overbroad -- remote write on the eager pool, whose rkey is never sent; the fast path has its own rings
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!g_eager_mr)
		return MPI_ERR_INTERN;
	g_cq = ibv_create_cq(ctx, RDV_CQ_DEPTH, NULL, NULL, 0);
	if (!g_cq)
		return MPI_ERR_INTERN; // OK: rdma-mr-leak -- the eager MR stays in its global; rdv_finalize() releases what init left behind
	return MPI_SUCCESS;
}

int rdv_fastpath_setup(struct rdv_peer *peers, int npeers)
{
	struct rdv_peer *p;
	int i;

	for (i = 0; i < npeers; i++) {
		p = &peers[i];
		p->fp_ring = calloc(RDV_FP_SLOTS, RDV_EAGER_SIZE);
		p->credit = calloc(8, sizeof(uint64_t));
		if (!p->fp_ring || !p->credit)
			goto unwind;
		/* BUG: rdma-local-mr-management -- the ring's rkey goes to the peer, which RDMA-writes eager messages into it */
		p->fp_mr = ibv_reg_mr(g_pd, p->fp_ring, RDV_FP_SLOTS * RDV_EAGER_SIZE,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!p->fp_mr)
			goto unwind;
		/* BUG: rdma-local-mr-management -- the credit word's rkey goes to the peer */
		p->cr_mr = ibv_reg_mr(g_pd, p->credit, 8 * sizeof(uint64_t),
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!p->cr_mr)
			goto unwind; // BUG: rdma-mr-leak -- the unwinding below stops under i, so this peer's fp_mr is never deregistered
		p->local_info.fp_addr = htobe64((uintptr_t)p->fp_ring);
		p->local_info.fp_rkey = htobe32(p->fp_mr->rkey);
		p->local_info.cr_addr = htobe64((uintptr_t)p->credit);
		p->local_info.cr_rkey = htobe32(p->cr_mr->rkey);
	}
	g_peers = peers;
	g_npeers = npeers;
	return MPI_SUCCESS;

unwind:
	free(peers[i].fp_ring);
	free(peers[i].credit);
	while (i--) {
		ibv_dereg_mr(peers[i].cr_mr);
		ibv_dereg_mr(peers[i].fp_mr);
		free(peers[i].credit);
		free(peers[i].fp_ring);
	}
	return MPI_ERR_NO_MEM;
}

static struct rdv_reg *rcache_get(void *buf, size_t len, int access)
{
	uintptr_t b = (uintptr_t)buf;
	struct rdv_reg *r, *victim = NULL;
	struct ibv_mr *mr;
	int i;

	for (i = 0; i < RDV_RCACHE_SIZE; i++) {
		r = &g_rcache[i];
		if (r->mr && r->base <= b && b + len <= r->base + r->len &&
		    (r->access & access) == access) {
			r->refcnt++;
			r->stamp = ++g_rcache_clock;
			return r;
		}
		if (r->refcnt)
			continue;
		if (!victim || !r->mr || (victim->mr && r->stamp < victim->stamp))
			victim = r;
	}
	if (!victim)
		return NULL;

	/* BUG: rdma-local-mr-management -- pins user buffers whose rkey travels in the RTS or that windows expose */
	mr = ibv_reg_mr(g_pd, buf, len, access); // OK: rdma-registration-in-datapath -- only on a miss of the registration cache
	if (!mr)
		return NULL;
	if (victim->mr)
		ibv_dereg_mr(victim->mr); // OK: rdma-mr-leak, rdma-registration-in-datapath -- the evicted pin is released before the slot is reused, on a miss only
	victim->mr = mr;
	victim->base = b;
	victim->len = len;
	victim->access = access;
	victim->refcnt = 1;
	victim->stamp = ++g_rcache_clock;
	return victim;
}

static void rcache_put(struct rdv_reg *r)
{
	if (r && r->refcnt > 0)
		r->refcnt--;
}

static int rdv_post_ctrl(struct rdv_peer *p, void *slot, size_t len, uint64_t wr_id)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge = {
		.addr = (uintptr_t)slot,
		.length = (uint32_t)len,
		.lkey = g_eager_mr->lkey,
	};

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(p->qp, &wr, &bad);
}

static void *rdv_eager_slot(void)
{
	unsigned int idx = g_eager_next++ % (RDV_EAGER_COUNT / 2);

	/* the upper half of the pool is the receive ring */
	return g_eager_pool + (size_t)idx * RDV_EAGER_SIZE;
}

int rdv_isend_large(int peer, void *buf, size_t len, uint32_t tag, struct rdv_req *req)
{
	struct rdv_peer *p = &g_peers[peer];
	struct rdv_rts *rts;

	/* OK: rdma-remote-access-overbroad -- the receiver reads the source with the key sent in the RTS */
	req->reg = rcache_get(buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!req->reg)
		return MPI_ERR_NO_MEM;
	req->peer = peer;
	req->ubuf = buf;
	req->len = len;

	rts = rdv_eager_slot();
	memset(rts, 0, sizeof(*rts));
	rts->hdr.type = RDV_MSG_RTS;
	rts->hdr.tag = htobe32(tag);
	rts->hdr.req_id = htobe64(req->id);
	rts->addr = htobe64((uintptr_t)buf);
	rts->len = htobe64(len);
	rts->rkey = htobe32(req->reg->mr->rkey);
	if (rdv_post_ctrl(p, rts, sizeof(*rts), 0)) {
		rcache_put(req->reg);
		req->reg = NULL;
		return MPI_ERR_OTHER;
	}
	return MPI_SUCCESS;
}

static int rdv_start_get(struct rdv_peer *p, struct rdv_req *req, const struct rdv_rts *rts)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	size_t len = be64toh(rts->len);

	/* iWARP places read responses through the sink's STag */
	/* BUG: rdma-local-mr-management -- per-message registration whose lkey addresses the runtime's own RDMA READ */
	req->sink_mr = ibv_reg_mr(g_pd, req->ubuf, len, // BUG: rdma-registration-in-datapath -- the receive buffer is pinned for every RGET
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // OK: rdma-remote-access-overbroad -- remote write on the sink of the RDMA READ
	if (!req->sink_mr)
		return MPI_ERR_NO_MEM;
	req->remote_id = be64toh(rts->hdr.req_id);

	sge.addr = (uintptr_t)req->ubuf;
	sge.length = (uint32_t)len;
	sge.lkey = req->sink_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)req;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = be64toh(rts->addr);
	wr.wr.rdma.rkey = be32toh(rts->rkey);
	if (ibv_post_send(p->qp, &wr, &bad)) {
		ibv_dereg_mr(req->sink_mr); // BUG: rdma-registration-in-datapath -- deregistration of the per-message sink
		req->sink_mr = NULL; // OK: rdma-mr-leak -- the sink was deregistered on the line above
		return MPI_ERR_OTHER;
	}
	return MPI_SUCCESS;
}

static void rdv_get_done(struct rdv_peer *p, struct ibv_wc *wc)
{
	struct rdv_req *req = (struct rdv_req *)(uintptr_t)wc->wr_id;
	struct rdv_hdr *fin;

	ibv_dereg_mr(req->sink_mr); // BUG: rdma-registration-in-datapath -- the RGET sink is deregistered in the READ completion
	req->sink_mr = NULL;
	req->done = wc->status == IBV_WC_SUCCESS ? 1 : -1;

	fin = rdv_eager_slot();
	memset(fin, 0, sizeof(*fin));
	fin->type = RDV_MSG_FIN;
	fin->req_id = htobe64(req->remote_id);
	rdv_post_ctrl(p, fin, sizeof(*fin), 0);
}

extern struct rdv_req *rdv_match_posted(uint32_t tag, size_t len);
extern struct rdv_req *rdv_lookup_req(uint64_t id);

static struct rdv_peer *rdv_peer_by_qpn(uint32_t qpn)
{
	int i;

	for (i = 0; i < g_npeers; i++)
		if (g_peers[i].qp->qp_num == qpn)
			return &g_peers[i];
	return NULL;
}

int rdv_progress(void)
{
	struct ibv_wc wc[32];
	struct rdv_hdr *hdr;
	struct rdv_req *req;
	int n, i;

	n = ibv_poll_cq(g_cq, 32, wc);
	for (i = 0; i < n; i++) {
		struct rdv_peer *p = rdv_peer_by_qpn(wc[i].qp_num);

		if (!p)
			continue;
		if (wc[i].opcode == IBV_WC_RDMA_READ) {
			rdv_get_done(p, &wc[i]);
			continue;
		}
		if (!(wc[i].opcode & IBV_WC_RECV) || wc[i].status != IBV_WC_SUCCESS)
			continue;
		hdr = (struct rdv_hdr *)(uintptr_t)wc[i].wr_id;
		switch (hdr->type) {
		case RDV_MSG_RTS: {
			struct rdv_rts *rts = (struct rdv_rts *)hdr;

			req = rdv_match_posted(be32toh(hdr->tag), be64toh(rts->len));
			if (req)
				rdv_start_get(p, req, rts);
			break;
		}
		case RDV_MSG_FIN:
			req = rdv_lookup_req(be64toh(hdr->req_id));
			if (req) {
				rcache_put(req->reg);
				req->reg = NULL;
				req->done = 1;
			}
			break;
		}
	}
	return n;
}

int rdv_win_create_dynamic(struct rdv_win *win, int peer)
{
	int i, j;

	memset(win, 0, sizeof(*win));
	win->peer = peer;
	for (i = 0; i < RDV_MAX_DYN_SEGS; i++) {
		win->seg[i].mw = ibv_alloc_mw(g_pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- the runtime allocates its own windows for attached memory
		if (!win->seg[i].mw)
			goto fail;
		win->seg[i].rkey = win->seg[i].mw->rkey;
	}
	return MPI_SUCCESS;

fail:
	for (j = 0; j < i; j++)
		ibv_dealloc_mw(win->seg[j].mw); // OK: rdma-mr-leak -- every window allocated before the failing one is freed
	return MPI_ERR_NO_MEM;
}

int rdv_win_attach(struct rdv_win *win, void *base, size_t size, uint32_t *rkey_out)
{
	struct rdv_peer *p = &g_peers[win->peer];
	struct ibv_mw_bind_info bi;
	struct rdv_dyn_seg *s = NULL;
	int i;

	for (i = 0; i < RDV_MAX_DYN_SEGS; i++) {
		if (!win->seg[i].attached) {
			s = &win->seg[i];
			break;
		}
	}
	if (!s)
		return MPI_ERR_NO_MEM;
	s->reg = rcache_get(base, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!s->reg)
		return MPI_ERR_NO_MEM;

	bi.mr = s->reg->mr;
	bi.addr = (uintptr_t)base;
	bi.length = size;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

	ibv_wr_start(p->qpx);
	p->qpx->wr_id = (uintptr_t)s;
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the runtime binds a window over the attached region itself */
	ibv_wr_bind_mw(p->qpx, s->mw, s->mw->rkey, &bi); // BUG: rdma-rkey-reuse -- a slot detached earlier is bound again under the key the peer got for its previous attachment
	if (ibv_wr_complete(p->qpx)) {
		rcache_put(s->reg);
		s->reg = NULL;
		return MPI_ERR_OTHER;
	}
	s->rkey = s->mw->rkey;
	s->base = base;
	s->size = size;
	s->attached = 1;
	*rkey_out = s->rkey;
	return MPI_SUCCESS;
}

int rdv_win_detach(struct rdv_win *win, void *base)
{
	struct rdv_peer *p = &g_peers[win->peer];
	struct rdv_dyn_seg *s;
	int i;

	for (i = 0; i < RDV_MAX_DYN_SEGS; i++) {
		s = &win->seg[i];
		if (!s->attached || s->base != base)
			continue;
		ibv_wr_start(p->qpx);
		p->qpx->wr_id = 0;
		p->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(p->qpx, s->rkey);
		if (ibv_wr_complete(p->qpx))
			return MPI_ERR_OTHER;
		s->attached = 0;
		rcache_put(s->reg);
		s->reg = NULL;
		return MPI_SUCCESS;
	}
	return MPI_ERR_OTHER;
}

void rdv_win_free(struct rdv_win *win)
{
	int i;

	for (i = 0; i < RDV_MAX_DYN_SEGS; i++) {
		rcache_put(win->seg[i].reg);
		ibv_dealloc_mw(win->seg[i].mw);
	}
}

void rdv_finalize(void)
{
	int i;

	for (i = 0; i < g_npeers; i++) {
		ibv_dereg_mr(g_peers[i].cr_mr);
		ibv_dereg_mr(g_peers[i].fp_mr);
		free(g_peers[i].credit);
		free(g_peers[i].fp_ring);
	}
	for (i = 0; i < RDV_RCACHE_SIZE; i++)
		if (g_rcache[i].mr)
			ibv_dereg_mr(g_rcache[i].mr);
	if (g_cq)
		ibv_destroy_cq(g_cq);
	if (g_eager_mr)
		ibv_dereg_mr(g_eager_mr);
	free(g_eager_pool);
	if (g_pd)
		ibv_dealloc_pd(g_pd);
}
