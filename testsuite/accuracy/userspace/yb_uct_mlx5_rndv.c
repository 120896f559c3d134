/*
 * yb_uct_mlx5_rndv.c - RC/mlx5 transport with GPU-direct memory handles,
 * in the style of UCX's uct_ib_md / uct_rc_mlx5.
 *
 * Memory domain: user memory is registered with ibv_reg_mr_iova2(), GPU
 * memory exported as a dma-buf with ibv_reg_dmabuf_mr(); both are packed
 * into a remote key for the peer.  Small zero-copy GETs use a tiny
 * registration cache in the domain.
 *
 * Endpoint: active messages land in a zero-based receive ring; the
 * rendezvous protocol either stages the payload (the peer GETs it from a
 * staging buffer that grows with the largest message) or, for an iov on
 * the receiving side, builds an indirect mlx5 mkey over the iov and hands
 * its rkey to the peer, which PUTs into it.  The mkey is invalidated when
 * the FIN arrives, and the iov registrations are dropped once the
 * LOCAL_INV completed.
 *
 * Only mlx5 InfiniBand/RoCE ports are used.
 *
 * Known problems: the dma-buf path leaks its MR when the handle cannot be
 * allocated, the AM ring carries remote write that no peer is told about,
 * resizing the AM ring drops the old registration, the iov mkey asks for
 * remote write without local write, and the iov is registered per message.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-queue-cap-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked -- annotated for MR lifetime, registration placement and access rights only
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/uio.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

typedef enum {
	UCS_OK			= 0,
	UCS_INPROGRESS		= 1,
	UCS_ERR_NO_RESOURCE	= -2,
	UCS_ERR_IO_ERROR	= -3,
	UCS_ERR_NO_MEMORY	= -4,
	UCS_ERR_INVALID_PARAM	= -5,
	UCS_ERR_NO_DEVICE	= -16,
} ucs_status_t;

#define ucs_error(_fmt, ...)	fprintf(stderr, "[yb_uct] " _fmt "\n", ##__VA_ARGS__)

#define YB_MAX_IOV		16
#define YB_MAX_RNDV		8
#define YB_RCACHE_SIZE		32
#define YB_AM_RING_DEPTH	64
#define YB_AM_SEG_DEFAULT	8192
#define YB_TX_QLEN		256

#define YB_AM_RING_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define YB_MD_ACCESS_RMA	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
				 IBV_ACCESS_REMOTE_READ)

enum { YB_WRID_AM = 1, YB_WRID_GET, YB_WRID_UMR, YB_WRID_INV_BASE = 0x100 };
enum { YB_AM_RTS = 1, YB_AM_RTR, YB_AM_FIN };

typedef struct {
	uint8_t		am_id;
	uint8_t		index;
	uint16_t	pad;
	uint32_t	rkey;
	uint64_t	addr;
	uint64_t	length;
} yb_am_hdr_t;

typedef struct {
	void		*addr;
	size_t		len;
	struct ibv_mr	*mr;
	uint64_t	last_use;
} yb_rcache_entry_t;

typedef struct {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	uint64_t		tick;
	yb_rcache_entry_t	rcache[YB_RCACHE_SIZE];
} yb_md_t;

typedef struct {
	struct ibv_mr	*mr;
	void		*address;
	size_t		length;
} yb_memh_t;

typedef struct yb_ep yb_ep_t;

typedef struct {
	yb_ep_t		*ep;
	int		in_use;
	int		iov_cnt;
	struct mlx5dv_mkey *mkey;
	struct ibv_mr	*mrs[YB_MAX_IOV];
	struct ibv_sge	sge[YB_MAX_IOV];
} yb_rndv_req_t;

struct yb_ep {
	yb_md_t			*md;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct mlx5dv_qp_ex	*mqpx;
	void			*am_ring;
	size_t			am_seg_size;
	struct ibv_mr		*am_mr;
	yb_am_hdr_t		*am_tx;
	struct ibv_mr		*am_tx_mr;
	unsigned		am_tx_head;
	void			*stage;
	size_t			stage_len;
	struct ibv_mr		*stage_mr;
	yb_rndv_req_t		rndv[YB_MAX_RNDV];
};

/* ---- memory domain ---------------------------------------------------- */

ucs_status_t yb_md_open(const char *name, yb_md_t **md_p)
{
	struct ibv_device **devs;
	yb_md_t *md;
	int i, n;

	devs = ibv_get_device_list(&n);
	if (!devs)
		return UCS_ERR_NO_DEVICE;
	md = calloc(1, sizeof(*md));
	for (i = 0; md && i < n; i++) {
		// OK: rdma-access-flags-transport -- device selection; no access flags depend on it
		if (devs[i]->transport_type != IBV_TRANSPORT_IB ||
		    !mlx5dv_is_supported(devs[i]))
			continue;
		if (name && strcmp(ibv_get_device_name(devs[i]), name))
			continue;
		md->ctx = ibv_open_device(devs[i]);
		break;
	}
	ibv_free_device_list(devs);
	if (!md || !md->ctx)
		goto err;
	md->pd = ibv_alloc_pd(md->ctx);
	if (!md->pd)
		goto err;
	*md_p = md;
	return UCS_OK;

err:
	if (md && md->ctx)
		ibv_close_device(md->ctx);
	free(md);
	return UCS_ERR_NO_DEVICE;
}

void yb_md_close(yb_md_t *md)
{
	int i;

	for (i = 0; i < YB_RCACHE_SIZE; i++)
		if (md->rcache[i].mr)
			ibv_dereg_mr(md->rcache[i].mr);
	ibv_dealloc_pd(md->pd);
	ibv_close_device(md->ctx);
	free(md);
}

ucs_status_t yb_md_mem_reg(yb_md_t *md, void *address, size_t length,
			   yb_memh_t **memh_p)
{
	yb_memh_t *memh;

	memh = malloc(sizeof(*memh));
	if (!memh)
		return UCS_ERR_NO_MEMORY;
	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- RMA rights include LOCAL_WRITE, and the rkey is packed for the peer by yb_md_mkey_pack()
	memh->mr = ibv_reg_mr_iova2(md->pd, address, length, (uintptr_t)address,
				    YB_MD_ACCESS_RMA);
	if (!memh->mr) {
		ucs_error("ibv_reg_mr_iova2(%p, %zu) failed: %m", address, length);
		free(memh);
		return UCS_ERR_IO_ERROR;
	}
	memh->address = address;
	memh->length = length;
	*memh_p = memh;
	return UCS_OK; // OK: rdma-mr-leak -- the handle goes to the caller, released by yb_md_mem_dereg()
}

ucs_status_t yb_md_mem_reg_dmabuf(yb_md_t *md, int fd, uint64_t offset,
				  size_t length, void *va, yb_memh_t **memh_p)
{
	struct ibv_mr *mr;
	yb_memh_t *memh;

	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- GPU buffer exposed for RMA; LOCAL_WRITE present and the rkey is packed
	mr = ibv_reg_dmabuf_mr(md->pd, offset, length, (uintptr_t)va, fd, YB_MD_ACCESS_RMA);
	if (!mr) {
		ucs_error("ibv_reg_dmabuf_mr(fd=%d) failed: %m", fd);
		return UCS_ERR_IO_ERROR;
	}
	memh = malloc(sizeof(*memh));
	if (!memh)
		return UCS_ERR_NO_MEMORY; // BUG: rdma-mr-leak -- the dma-buf MR is dropped when the handle cannot be allocated
	memh->mr = mr;
	memh->address = va;
	memh->length = length;
	*memh_p = memh;
	return UCS_OK;
}

void yb_md_mem_dereg(yb_md_t *md, yb_memh_t *memh)
{
	(void)md;
	if (ibv_dereg_mr(memh->mr))
		ucs_error("ibv_dereg_mr(%p) failed", memh->address);
	free(memh);
}

size_t yb_md_mkey_pack(const yb_memh_t *memh, void *buf)
{
	uint32_t rkey = memh->mr->rkey;
	uint64_t addr = (uintptr_t)memh->address;

	memcpy(buf, &rkey, sizeof(rkey));
	memcpy((char *)buf + sizeof(rkey), &addr, sizeof(addr));
	return sizeof(rkey) + sizeof(addr);
}

/* borrowed MR for a short-lived local buffer; the cache owns it */
static struct ibv_mr *yb_md_rcache_get(yb_md_t *md, void *addr, size_t len)
{
	yb_rcache_entry_t *e, *victim = &md->rcache[0];
	int i;

	for (i = 0; i < YB_RCACHE_SIZE; i++) {
		e = &md->rcache[i];
		if (e->mr && (char *)addr >= (char *)e->addr &&
		    (char *)addr + len <= (char *)e->addr + e->len) {
			e->last_use = ++md->tick;
			return e->mr;
		}
		if (!e->mr || e->last_use < victim->last_use)
			victim = e;
	}
	if (victim->mr)
		ibv_dereg_mr(victim->mr);
	// OK: rdma-registration-in-datapath, rdma-mr-leak -- registration cache: only on a miss, after the victim was released
	victim->mr = ibv_reg_mr(md->pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
	if (!victim->mr)
		return NULL;
	victim->addr = addr;
	victim->len = len;
	victim->last_use = ++md->tick;
	return victim->mr;
}

/* ---- endpoint --------------------------------------------------------- */

static int yb_ep_post_am_recvs(yb_ep_t *ep)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	int i;

	for (i = 0; i < YB_AM_RING_DEPTH; i++) {
		/* the ring is registered zero-based: addresses are offsets */
		sge.addr = (uint64_t)i * ep->am_seg_size;
		sge.length = (uint32_t)ep->am_seg_size;
		sge.lkey = ep->am_mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		if (ibv_post_recv(ep->qp, &wr, &bad))
			return -1;
	}
	return 0;
}

void yb_ep_destroy(yb_ep_t *ep)
{
	int i, j;

	for (i = 0; i < YB_MAX_RNDV; i++) {
		for (j = 0; j < ep->rndv[i].iov_cnt; j++)
			ibv_dereg_mr(ep->rndv[i].mrs[j]);
		if (ep->rndv[i].mkey)
			mlx5dv_destroy_mkey(ep->rndv[i].mkey);
	}
	if (ep->qp)
		ibv_destroy_qp(ep->qp);
	if (ep->cq)
		ibv_destroy_cq(ep->cq);
	if (ep->stage_mr)
		ibv_dereg_mr(ep->stage_mr);
	if (ep->am_tx_mr)
		ibv_dereg_mr(ep->am_tx_mr);
	if (ep->am_mr)
		ibv_dereg_mr(ep->am_mr);
	free(ep->stage);
	free(ep->am_tx);
	free(ep->am_ring);
	free(ep);
}

ucs_status_t yb_ep_create(yb_md_t *md, yb_ep_t **ep_p)
{
	struct ibv_qp_init_attr_ex qp_attr;
	struct mlx5dv_qp_init_attr dv_attr;
	struct mlx5dv_mkey_init_attr mkey_attr;
	yb_ep_t *ep;
	int i;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return UCS_ERR_NO_MEMORY;
	ep->md = md;
	ep->am_seg_size = YB_AM_SEG_DEFAULT;
	for (i = 0; i < YB_MAX_RNDV; i++)
		ep->rndv[i].ep = ep;

	ep->am_ring = aligned_alloc(4096, YB_AM_RING_DEPTH * ep->am_seg_size);
	ep->am_tx = calloc(YB_TX_QLEN, sizeof(*ep->am_tx));
	if (!ep->am_ring || !ep->am_tx)
		goto err;
	// BUG: rdma-remote-access-overbroad -- the AM ring is a RECV target; its rkey is never sent to a peer
	ep->am_mr = ibv_reg_mr_iova2(md->pd, ep->am_ring, YB_AM_RING_DEPTH * ep->am_seg_size,
				     0, YB_AM_RING_ACCESS);
	ep->am_tx_mr = ibv_reg_mr(md->pd, ep->am_tx, YB_TX_QLEN * sizeof(*ep->am_tx), 0);
	if (!ep->am_mr || !ep->am_tx_mr)
		goto err; // OK: rdma-mr-leak -- yb_ep_destroy() releases whichever of the two was registered

	ep->cq = ibv_create_cq(md->ctx, YB_TX_QLEN + YB_AM_RING_DEPTH, NULL, NULL, 0);
	if (!ep->cq)
		goto err;
	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_type = IBV_QPT_RC;
	qp_attr.send_cq = ep->cq;
	qp_attr.recv_cq = ep->cq;
	qp_attr.pd = md->pd;
	qp_attr.cap.max_send_wr = YB_TX_QLEN;
	qp_attr.cap.max_recv_wr = YB_AM_RING_DEPTH;
	qp_attr.cap.max_send_sge = 1;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.cap.max_inline_data = 64;
	qp_attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qp_attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ |
				 IBV_QP_EX_WITH_LOCAL_INV;
	memset(&dv_attr, 0, sizeof(dv_attr));
	dv_attr.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv_attr.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;
	ep->qp = mlx5dv_create_qp(md->ctx, &qp_attr, &dv_attr);
	if (!ep->qp)
		goto err;
	ep->qpx = ibv_qp_to_qp_ex(ep->qp);
	ep->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(ep->qpx);

	memset(&mkey_attr, 0, sizeof(mkey_attr));
	mkey_attr.pd = md->pd;
	mkey_attr.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
	mkey_attr.max_entries = YB_MAX_IOV;
	for (i = 0; i < YB_MAX_RNDV; i++) {
		ep->rndv[i].mkey = mlx5dv_create_mkey(&mkey_attr);
		if (!ep->rndv[i].mkey)
			goto err;
	}
	if (yb_ep_post_am_recvs(ep))
		goto err;
	*ep_p = ep;
	return UCS_OK;

err:
	yb_ep_destroy(ep);
	return UCS_ERR_IO_ERROR;
}

/* configuration change on a quiesced endpoint: no receive is outstanding */
ucs_status_t yb_ep_set_am_seg_size(yb_ep_t *ep, size_t seg_size)
{
	struct ibv_mr *mr;
	void *ring;

	if (seg_size == ep->am_seg_size)
		return UCS_OK;
	ring = aligned_alloc(4096, YB_AM_RING_DEPTH * seg_size);
	if (!ring)
		return UCS_ERR_NO_MEMORY;
	// BUG: rdma-remote-access-overbroad -- same needless remote write on the new ring
	mr = ibv_reg_mr_iova2(ep->md->pd, ring, YB_AM_RING_DEPTH * seg_size, 0,
			      YB_AM_RING_ACCESS);
	if (!mr) {
		free(ring);
		return UCS_ERR_IO_ERROR;
	}
	free(ep->am_ring);
	ep->am_ring = ring;
	ep->am_seg_size = seg_size;
	ep->am_mr = mr; // BUG: rdma-mr-leak -- the old ring's MR is overwritten without ibv_dereg_mr()
	return yb_ep_post_am_recvs(ep) ? UCS_ERR_IO_ERROR : UCS_OK;
}

static ucs_status_t yb_ep_am_send(yb_ep_t *ep, const yb_am_hdr_t *hdr)
{
	yb_am_hdr_t *tx = &ep->am_tx[ep->am_tx_head++ % YB_TX_QLEN];

	*tx = *hdr;
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = YB_WRID_AM;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ep->qpx);
	ibv_wr_set_sge(ep->qpx, ep->am_tx_mr->lkey, (uintptr_t)tx, sizeof(*tx));
	return ibv_wr_complete(ep->qpx) ? UCS_ERR_IO_ERROR : UCS_OK;
}

static ucs_status_t yb_ep_stage_reserve(yb_ep_t *ep, size_t want)
{
	void *buf;

	if (want <= ep->stage_len)
		return UCS_OK;
	if (ep->stage_mr) {
		ibv_dereg_mr(ep->stage_mr);
		ep->stage_mr = NULL;
	}
	free(ep->stage);
	ep->stage_len = 0;
	ep->stage = buf = aligned_alloc(4096, (want + 4095) & ~(size_t)4095);
	if (!buf)
		return UCS_ERR_NO_MEMORY;
	// OK: rdma-registration-in-datapath, rdma-mr-leak, rdma-remote-access-overbroad -- grows past the recorded size only; the old MR was released; the peer GETs with the rkey sent in the RTS
	ep->stage_mr = ibv_reg_mr(ep->md->pd, buf, want,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!ep->stage_mr)
		return UCS_ERR_IO_ERROR;
	ep->stage_len = want;
	return UCS_OK;
}

ucs_status_t yb_ep_rndv_send_staged(yb_ep_t *ep, const void *data, size_t len)
{
	yb_am_hdr_t rts = { .am_id = YB_AM_RTS };
	ucs_status_t status;

	status = yb_ep_stage_reserve(ep, len);
	if (status != UCS_OK)
		return status;
	memcpy(ep->stage, data, len);
	rts.rkey = ep->stage_mr->rkey;
	rts.addr = (uintptr_t)ep->stage;
	rts.length = len;
	return yb_ep_am_send(ep, &rts);
}

ucs_status_t yb_ep_get_zcopy(yb_ep_t *ep, void *buf, size_t len,
			     uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_mr *mr = yb_md_rcache_get(ep->md, buf, len);

	if (!mr)
		return UCS_ERR_IO_ERROR;
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = YB_WRID_GET;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(ep->qpx, rkey, remote_addr);
	// OK: rdma-access-flags-transport -- READ sink with LOCAL_WRITE only, but yb_md_open() takes InfiniBand ports only
	ibv_wr_set_sge(ep->qpx, mr->lkey, (uintptr_t)buf, (uint32_t)len);
	return ibv_wr_complete(ep->qpx) ? UCS_ERR_IO_ERROR : UCS_INPROGRESS;
}

static void yb_rndv_req_release(yb_rndv_req_t *req)
{
	int i;

	for (i = 0; i < req->iov_cnt; i++)
		ibv_dereg_mr(req->mrs[i]); // BUG: rdma-registration-in-datapath -- the message's iov registrations are dropped on the completion path
	req->iov_cnt = 0;
	req->in_use = 0;
}

/* receiver side of an iov rendezvous: expose the iov to the peer's PUT */
ucs_status_t yb_ep_rndv_expose_iov(yb_ep_t *ep, const struct iovec *iov, int iovcnt)
{
	yb_am_hdr_t rtr = { .am_id = YB_AM_RTR };
	yb_rndv_req_t *req = NULL;
	uint64_t total = 0;
	int i;

	if (iovcnt > YB_MAX_IOV)
		return UCS_ERR_INVALID_PARAM;
	for (i = 0; i < YB_MAX_RNDV && !req; i++)
		if (!ep->rndv[i].in_use)
			req = &ep->rndv[i];
	if (!req)
		return UCS_ERR_NO_RESOURCE;
	req->in_use = 1;

	for (i = 0; i < iovcnt; i++) {
		// BUG: rdma-registration-in-datapath -- every iov entry of every message is registered here
		req->mrs[i] = ibv_reg_mr(ep->md->pd, iov[i].iov_base, iov[i].iov_len,
					 IBV_ACCESS_LOCAL_WRITE);
		if (!req->mrs[i])
			goto err;
		req->iov_cnt = i + 1;
		req->sge[i].addr = (uintptr_t)iov[i].iov_base;
		req->sge[i].length = (uint32_t)iov[i].iov_len;
		req->sge[i].lkey = req->mrs[i]->lkey;
		total += iov[i].iov_len;
	}

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = YB_WRID_UMR;
	ep->qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	// BUG: rdma-access-flags-invalid -- the mkey grants REMOTE_WRITE without LOCAL_WRITE
	mlx5dv_wr_mr_list(ep->mqpx, req->mkey, IBV_ACCESS_REMOTE_WRITE,
			  (uint16_t)iovcnt, req->sge);
	if (ibv_wr_complete(ep->qpx))
		goto err;

	rtr.index = (uint8_t)(req - ep->rndv);
	rtr.rkey = req->mkey->rkey;
	rtr.addr = 0;
	rtr.length = total;
	if (yb_ep_am_send(ep, &rtr) != UCS_OK)
		goto err;
	return UCS_INPROGRESS;

err:
	yb_rndv_req_release(req); // OK: rdma-mr-leak -- releases the registrations made so far, none for the failed index
	return UCS_ERR_IO_ERROR;
}

static void yb_ep_handle_wc(yb_ep_t *ep, struct ibv_wc *wc)
{
	const yb_am_hdr_t *hdr;

	if (wc->status != IBV_WC_SUCCESS) {
		ucs_error("wc %s on wr_id %lu", ibv_wc_status_str(wc->status),
			  (unsigned long)wc->wr_id);
		return;
	}
	if (wc->opcode == IBV_WC_RECV) {
		hdr = (const yb_am_hdr_t *)((char *)ep->am_ring + wc->wr_id * ep->am_seg_size);
		if (hdr->am_id == YB_AM_FIN && hdr->index < YB_MAX_RNDV) {
			/* the peer is done writing: kill the iov key, then unpin */
			ibv_wr_start(ep->qpx);
			ep->qpx->wr_id = YB_WRID_INV_BASE + hdr->index;
			ep->qpx->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_local_inv(ep->qpx, ep->rndv[hdr->index].mkey->rkey);
			if (ibv_wr_complete(ep->qpx))
				ucs_error("LOCAL_INV post failed");
		}
		return;
	}
	if (wc->opcode == IBV_WC_LOCAL_INV && wc->wr_id >= YB_WRID_INV_BASE &&
	    wc->wr_id < YB_WRID_INV_BASE + YB_MAX_RNDV)
		yb_rndv_req_release(&ep->rndv[wc->wr_id - YB_WRID_INV_BASE]);
}

int yb_ep_progress(yb_ep_t *ep)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(ep->cq, 16, wc);
	for (i = 0; i < n; i++)
		yb_ep_handle_wc(ep, &wc[i]);
	return n;
}
