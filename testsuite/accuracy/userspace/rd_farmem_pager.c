/*
 * rd_farmem_pager.c - far-memory pager backed by a remote memory server
 *
 * Cold pages of the application's heap are swapped out with RDMA WRITE to
 * slots on a memory server and faulted back in with RDMA READ.  Ordinary
 * anonymous memory is covered by one implicit ODP MR (addr 0, SIZE_MAX), so
 * no page is pinned on the fault path; devices without implicit ODP are
 * refused.  Regions the application declares "pinned" are registered on
 * first touch and kept; fsdax-backed regions cannot be covered by ODP and
 * are pinned per transfer.  The memory server may push hot pages into a
 * push window (its rkey is sent in a control message), and a working set
 * can be exported to a peer through an mlx5 indirect mkey.
 *
 * Status codes follow the ucs convention (negative = error).
 *
 * NOT-ANNOTATED: rdma-queue-cap-unchecked, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define PGR_PAGE_SIZE		4096
#define PGR_MAX_REGIONS		32
#define PGR_MAX_INFLIGHT	256
#define PGR_CTRL_SIZE		4096
#define PGR_REGION_PINNED	0x1
#define PGR_REGION_FSDAX	0x2

/* Window the memory server may push hot pages into. */
#define PGR_PUSH_ACCESS		(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_WRITE)

typedef enum {
	PGR_OK			= 0,
	PGR_ERR_NO_MEMORY	= -4,
	PGR_ERR_IO		= -3,
	PGR_ERR_UNSUPPORTED	= -22,
} pgr_status_t;

enum { PGR_SWAP_IN, PGR_SWAP_OUT };

typedef struct pgr_region {
	void		*addr;
	size_t		 len;
	unsigned	 flags;
	struct ibv_mr	*mr;		/* PGR_REGION_PINNED only */
} pgr_region_t;

typedef struct pgr_xfer {
	struct pgr_xfer	*next;
	void		*frame;
	uint64_t	 slot;
	struct ibv_mr	*mr;		/* fsdax: pinned for this transfer */
	int		 dir;
} pgr_xfer_t;

typedef struct pgr_ctrl_msg {
	uint32_t	 op;
	uint32_t	 rkey;
	uint64_t	 addr;
	uint64_t	 len;
} pgr_ctrl_msg_t;

typedef struct pgr_ctx {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct mlx5dv_qp_ex	*mqp;
	uint32_t		 max_inflight;

	struct ibv_mr		*odp_mr;
	char			*ctrl;
	struct ibv_mr		*ctrl_mr;
	void			*push_area;
	size_t			 push_len;
	struct ibv_mr		*push_mr;
	struct mlx5dv_mkey	*ws_mkey;

	uint64_t		 remote_base;
	uint32_t		 remote_rkey;

	pgr_region_t		 regions[PGR_MAX_REGIONS];
	int			 nregions;
	pgr_xfer_t		 xfers[PGR_MAX_INFLIGHT];
	pgr_xfer_t		*free_xfers;
} pgr_ctx_t;

extern int pgr_wait_wc(pgr_ctx_t *p, uint64_t wr_id);

static pgr_status_t pgr_device_open(pgr_ctx_t *p, struct ibv_device *dev)
{
	struct ibv_device_attr_ex attr;
	struct ibv_qp_init_attr_ex qa;
	struct mlx5dv_qp_init_attr dva;

	if (!mlx5dv_is_supported(dev))
		return PGR_ERR_UNSUPPORTED;
	p->ctx = ibv_open_device(dev);
	if (!p->ctx)
		return PGR_ERR_IO;
	if (ibv_query_device_ex(p->ctx, NULL, &attr))
		return PGR_ERR_IO;
	/* Anonymous memory is never pinned: no implicit ODP, no pager. */
	if (!(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT))
		return -EOPNOTSUPP;
	if (!(attr.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_READ))
		return -EOPNOTSUPP;

	p->max_inflight = PGR_MAX_INFLIGHT;
	if ((uint32_t)attr.orig_attr.max_qp_wr < p->max_inflight)
		p->max_inflight = attr.orig_attr.max_qp_wr;

	p->pd = ibv_alloc_pd(p->ctx);
	p->cq = ibv_create_cq(p->ctx, 2 * p->max_inflight, NULL, NULL, 0);
	if (!p->pd || !p->cq)
		return PGR_ERR_NO_MEMORY;

	memset(&qa, 0, sizeof(qa));
	qa.send_cq = p->cq;
	qa.recv_cq = p->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = p->max_inflight;
	qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = p->pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	memset(&dva, 0, sizeof(dva));
	dva.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dva.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;
	p->qp = mlx5dv_create_qp(p->ctx, &qa, &dva);
	if (!p->qp)
		return PGR_ERR_IO;
	p->qpx = ibv_qp_to_qp_ex(p->qp);
	p->mqp = mlx5dv_qp_ex_from_ibv_qp_ex(p->qpx);
	return PGR_OK;
}

static pgr_status_t pgr_mem_init(pgr_ctx_t *p)
{
	int i;

	p->odp_mr = ibv_reg_mr(p->pd, NULL, SIZE_MAX,
			       IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-access-flags-invalid -- local write only */ /* BUG: rdma-local-mr-management -- its lkey addresses the pager's own RDMA READ/WRITE */
	if (!p->odp_mr)
		return PGR_ERR_IO;

	p->ctrl = aligned_alloc(PGR_PAGE_SIZE, PGR_CTRL_SIZE);
	if (!p->ctrl)
		goto err_odp;
	p->ctrl_mr = ibv_reg_mr(p->pd, p->ctrl, PGR_CTRL_SIZE, IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- control buffer for SEND/RECV, registered once */
	if (!p->ctrl_mr)
		goto err_ctrl;

	p->free_xfers = NULL;
	for (i = 0; i < (int)p->max_inflight; i++) {
		p->xfers[i].next = p->free_xfers;
		p->free_xfers = &p->xfers[i];
	}
	return PGR_OK;

err_ctrl:
	free(p->ctrl);
err_odp:
	ibv_dereg_mr(p->odp_mr);	/* OK: rdma-mr-leak -- every failure after the ODP registration releases it */
	return PGR_ERR_NO_MEMORY;
}

static void pgr_mem_fini(pgr_ctx_t *p)
{
	ibv_dereg_mr(p->ctrl_mr);
	free(p->ctrl);
	ibv_dereg_mr(p->odp_mr);
}

/* Post one control SEND from p->ctrl and wait for it. */
static int pgr_ctrl_send(pgr_ctx_t *p, const pgr_ctrl_msg_t *msg)
{
	memcpy(p->ctrl, msg, sizeof(*msg));
	ibv_wr_start(p->qpx);
	p->qpx->wr_id = UINT64_MAX;
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(p->qpx);
	ibv_wr_set_sge(p->qpx, p->ctrl_mr->lkey, (uintptr_t)p->ctrl, sizeof(*msg));
	if (ibv_wr_complete(p->qpx))
		return -1;
	return pgr_wait_wc(p, UINT64_MAX);
}

static pgr_status_t pgr_push_window_open(pgr_ctx_t *p, size_t len)
{
	pgr_ctrl_msg_t msg = { .op = 1 };

	p->push_area = aligned_alloc(PGR_PAGE_SIZE, len);
	if (!p->push_area)
		return PGR_ERR_NO_MEMORY;
	p->push_mr = ibv_reg_mr(p->pd, p->push_area, len, PGR_PUSH_ACCESS); /* BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE */ /* BUG: rdma-local-mr-management -- the rkey goes to the memory server */ /* OK: rdma-registration-in-datapath -- one window per connection, kept in the connection struct */
	if (!p->push_mr) {
		free(p->push_area);
		return PGR_ERR_IO;
	}
	p->push_len = len;

	msg.rkey = p->push_mr->rkey;
	msg.addr = (uintptr_t)p->push_area;
	msg.len = len;
	if (pgr_ctrl_send(p, &msg)) {
		fprintf(stderr, "pager: memory server did not take the push window\n");
		free(p->push_area);	/* BUG: rdma-invalidation-leak -- the window's rkey may already be with the server and the MR is never deregistered */
		return PGR_ERR_IO;	/* BUG: rdma-mr-leak -- p->push_mr is left registered on the error return */
	}
	return PGR_OK;
}

/* First touch of a pinned region: register it once and keep it. */
static pgr_status_t pgr_region_pin(pgr_ctx_t *p, pgr_region_t *reg)
{
	if (!reg->mr) {
		reg->mr = ibv_reg_mr(p->pd, reg->addr, reg->len,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); /* OK: rdma-registration-in-datapath -- registered on first use and kept */ /* BUG: rdma-local-mr-management -- addresses the pager's own RDMA READ/WRITE */ /* OK: rdma-access-flags-invalid -- remote read needs no local write */
		if (!reg->mr)
			return PGR_ERR_IO;
	}
	return PGR_OK;
}

/* The application grew a pinned region (mremap). */
static pgr_status_t pgr_region_grow(pgr_ctx_t *p, pgr_region_t *reg, size_t want)
{
	struct ibv_mr *mr;

	if (want <= reg->len)
		return PGR_OK;
	if (!reg->mr) {
		reg->len = want;	/* not touched yet: pinned at the next fault */
		return PGR_OK;
	}
	mr = ibv_reg_mr(p->pd, reg->addr, want,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); /* OK: rdma-registration-in-datapath -- a buffer that grows, not per I/O */ /* BUG: rdma-local-mr-management -- addresses the pager's own RDMA READ/WRITE */
	if (!mr)
		return PGR_ERR_IO;
	reg->mr = mr;		/* BUG: rdma-mr-leak -- the region's previous registration is overwritten without ibv_dereg_mr */
	reg->len = want;
	return PGR_OK;
}

/* fsdax pages: ODP cannot fault them, pin them for the transfer. */
static struct ibv_mr *pgr_reg_fsdax(pgr_ctx_t *p, void *frame, int dir)
{
	int access = IBV_ACCESS_LOCAL_WRITE;

	/* shared with the generic transport layer */
	if (dir == PGR_SWAP_IN)
		access |= p->ctx->device->transport_type == IBV_TRANSPORT_IWARP ?
			  IBV_ACCESS_REMOTE_WRITE : 0;
	return ibv_reg_mr(p->pd, frame, PGR_PAGE_SIZE, access); /* BUG: rdma-access-flags-transport -- sink rights chosen by an inline iWARP test */ /* BUG: rdma-registration-in-datapath -- one registration per page transfer */ /* BUG: rdma-local-mr-management -- per-I/O registration */ /* OK: rdma-mr-leak -- returned to the caller */ /* OK: rdma-access-flags-invalid -- LOCAL_WRITE on every path */
}

static pgr_status_t pgr_swap_in(pgr_ctx_t *p, pgr_region_t *reg, void *frame, uint64_t slot)
{
	struct ibv_sge pf = { .addr = (uintptr_t)frame, .length = PGR_PAGE_SIZE };
	struct ibv_mr *mr = NULL;
	pgr_xfer_t *x;
	uint32_t lkey;

	x = p->free_xfers;
	if (!x)
		return PGR_ERR_NO_MEMORY;

	if (reg->flags & PGR_REGION_FSDAX) {
		mr = pgr_reg_fsdax(p, frame, PGR_SWAP_IN);
		if (!mr)
			return PGR_ERR_IO;
		lkey = mr->lkey;
	} else if (reg->flags & PGR_REGION_PINNED) {
		lkey = reg->mr->lkey;
	} else {
		lkey = p->odp_mr->lkey;
		pf.lkey = lkey;
		ibv_advise_mr(p->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &pf, 1); /* OK: rdma-registration-in-datapath -- prefetch advice on the ODP MR, not a registration */
	}

	ibv_wr_start(p->qpx);
	p->qpx->wr_id = (uint64_t)(x - p->xfers);
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(p->qpx, p->remote_rkey, p->remote_base + slot * PGR_PAGE_SIZE);
	ibv_wr_set_sge(p->qpx, lkey, (uintptr_t)frame, PGR_PAGE_SIZE); /* OK: rdma-access-flags-transport -- the pager refuses devices without implicit ODP, so never runs on iWARP */
	if (ibv_wr_complete(p->qpx))
		return PGR_ERR_IO;	/* BUG: rdma-mr-leak -- the fsdax pin is dropped when the post fails */

	p->free_xfers = x->next;
	x->frame = frame;
	x->slot = slot;
	x->mr = mr;
	x->dir = PGR_SWAP_IN;
	return PGR_OK;
}

static pgr_status_t pgr_swap_out(pgr_ctx_t *p, void *frame, uint64_t slot)
{
	pgr_xfer_t *x = p->free_xfers;

	if (!x)
		return PGR_ERR_NO_MEMORY;
	ibv_wr_start(p->qpx);
	p->qpx->wr_id = (uint64_t)(x - p->xfers);
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(p->qpx, p->remote_rkey, p->remote_base + slot * PGR_PAGE_SIZE);
	ibv_wr_set_sge(p->qpx, p->odp_mr->lkey, (uintptr_t)frame, PGR_PAGE_SIZE);
	if (ibv_wr_complete(p->qpx))
		return PGR_ERR_IO;
	p->free_xfers = x->next;
	x->frame = frame;
	x->slot = slot;
	x->mr = NULL;
	x->dir = PGR_SWAP_OUT;
	return PGR_OK;
}

static void pgr_handle_completion(pgr_ctx_t *p, struct ibv_wc *wc)
{
	pgr_xfer_t *x;

	if (wc->wr_id >= p->max_inflight)
		return;
	x = &p->xfers[wc->wr_id];
	if (wc->status != IBV_WC_SUCCESS)
		fprintf(stderr, "pager: slot %llu %s failed: %s\n", (unsigned long long)x->slot,
			x->dir == PGR_SWAP_IN ? "swap-in" : "swap-out", ibv_wc_status_str(wc->status));
	if (x->mr) {
		ibv_dereg_mr(x->mr);	/* BUG: rdma-registration-in-datapath -- unpins the fsdax page on every completion */ /* OK: rdma-mr-leak -- released before the slot is recycled */
		x->mr = NULL;
	}
	x->next = p->free_xfers;
	p->free_xfers = x;
}

pgr_status_t pgr_fault(pgr_ctx_t *p, void *addr, void *frame, uint64_t slot)
{
	pgr_region_t *reg = NULL;
	int i;

	for (i = 0; i < p->nregions; i++) {
		if ((char *)addr >= (char *)p->regions[i].addr &&
		    (char *)addr < (char *)p->regions[i].addr + p->regions[i].len) {
			reg = &p->regions[i];
			break;
		}
	}
	if (!reg)
		return PGR_ERR_UNSUPPORTED;
	if ((reg->flags & PGR_REGION_PINNED) && pgr_region_pin(p, reg))
		return PGR_ERR_IO;
	return pgr_swap_in(p, reg, frame, slot);
}

pgr_status_t pgr_region_resize(pgr_ctx_t *p, int idx, size_t len)
{
	if (!(p->regions[idx].flags & PGR_REGION_PINNED))
		return PGR_OK;
	return pgr_region_grow(p, &p->regions[idx], len);
}

/* Export @n cached pages of pinned regions to a peer as one contiguous key. */
pgr_status_t pgr_export_ws(pgr_ctx_t *p, struct ibv_sge *pages, uint16_t n, int writable,
			   uint32_t *rkey_out)
{
	struct mlx5dv_mkey_init_attr mia = {
		.pd = p->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = 64,
	};
	uint32_t access = IBV_ACCESS_REMOTE_READ;

	if (!p->ws_mkey) {
		p->ws_mkey = mlx5dv_create_mkey(&mia); /* BUG: rdma-local-mr-management -- mlx5 indirect mkey managed by the pager */
		if (!p->ws_mkey)
			return PGR_ERR_IO;
	}
	if (writable)
		access |= IBV_ACCESS_REMOTE_WRITE;

	ibv_wr_start(p->qpx);
	p->qpx->wr_id = UINT64_MAX - 1;
	p->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(p->mqp, p->ws_mkey, access, n, pages); /* BUG: rdma-access-flags-invalid -- writable exports ask REMOTE_WRITE without LOCAL_WRITE */ /* BUG: rdma-local-mr-management -- the mkey's rkey is exposed to the peer */
	if (ibv_wr_complete(p->qpx) || pgr_wait_wc(p, UINT64_MAX - 1))
		return PGR_ERR_IO;
	*rkey_out = p->ws_mkey->rkey;
	return PGR_OK;
}

static pgr_status_t pgr_unexport_ws(pgr_ctx_t *p)
{
	ibv_wr_start(p->qpx);
	p->qpx->wr_id = UINT64_MAX - 2;
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(p->qpx, p->ws_mkey->rkey);
	if (ibv_wr_complete(p->qpx))
		return PGR_ERR_IO;
	return pgr_wait_wc(p, UINT64_MAX - 2) ? PGR_ERR_IO : PGR_OK;
}

void pgr_close(pgr_ctx_t *p)
{
	int i;

	if (p->ws_mkey && pgr_unexport_ws(p) == PGR_OK)
		mlx5dv_destroy_mkey(p->ws_mkey);
	for (i = 0; i < p->nregions; i++)
		if (p->regions[i].mr)
			ibv_dereg_mr(p->regions[i].mr);
	if (p->push_mr) {
		ibv_dereg_mr(p->push_mr);
		free(p->push_area);	/* OK: rdma-invalidation-leak -- the window was deregistered first */
	}
	pgr_mem_fini(p);
	ibv_destroy_qp(p->qp);
	ibv_destroy_cq(p->cq);
	ibv_dealloc_pd(p->pd);
	ibv_close_device(p->ctx);
}

pgr_status_t pgr_open(pgr_ctx_t *p, struct ibv_device *dev, size_t push_len)
{
	pgr_status_t st;

	memset(p, 0, sizeof(*p));
	st = pgr_device_open(p, dev);
	if (st != PGR_OK)
		return st;
	st = pgr_mem_init(p);
	if (st != PGR_OK)
		return st;
	if (push_len) {
		st = pgr_push_window_open(p, push_len);
		if (st != PGR_OK) {
			pgr_mem_fini(p);
			return st;
		}
	}
	return PGR_OK;
}

int pgr_evict(pgr_ctx_t *p, void *frame, uint64_t slot)
{
	struct ibv_wc wc[8];
	int n, i;

	if (pgr_swap_out(p, frame, slot) != PGR_OK)
		return -1;
	while ((n = ibv_poll_cq(p->cq, 8, wc)) > 0)
		for (i = 0; i < n; i++)
			pgr_handle_completion(p, &wc[i]);
	return 0;
}
