/*
 * ua_mlx5_umr_sgl.c - scatter/gather RPC initiator on mlx5 indirect mkeys.
 *
 * An I/O is an iovec.  Fragments that live in the pre-registered slabs (or,
 * with implicit ODP, anywhere) are described by their slab lkey; a foreign
 * fragment is registered for the I/O.  Each I/O slot owns an indirect mkey
 * (created with REMOTE_INVALIDATE); submit posts a UMR (mlx5dv_wr_mr_list)
 * over the fragments followed by the request SEND that carries the mkey's
 * rkey, in one ibv_wr_start()/ibv_wr_complete() batch.  The target moves the
 * data and replies with SEND_WITH_INV of that rkey.  Registration helpers
 * and completion handling live in their own functions; the reply path works
 * on a copy of the completion's flags and invalidated rkey (xprtrdma style).
 *
 * Correct: slab unwind, the synchronous abort, the reply path compares the
 * invalidated rkey and otherwise invalidates and releases from the LOCAL_INV
 * completion, 3 SQ entries per slot, the inline size read back.
 * Not correct: slab_reg() leaks its MR when madvise fails, implicit ODP with
 * remote rights, the sink UMR grants REMOTE_WRITE without LOCAL_WRITE,
 * foreign fragments registered per I/O, signaling keyed on a counter nothing
 * advances, error replies trust any invalidation, timeouts hand the slot back
 * with the mkey live, cancel and teardown release before their LOCAL_INVs
 * complete, a receive queue of 2048 requested blind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define IO_DEPTH	64
#define IO_MAX_SGE	16
#define IO_RECV_DEPTH	2048
#define SLAB_SIZE	(4UL << 20)
#define NSLABS		32
#define SIGNAL_EVERY	16
#define SLAB_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

enum { WR_UMR = 1, WR_REQ, WR_INV, WR_RECV };
enum io_dir { IO_TO_TARGET, IO_FROM_TARGET };

struct rpc_msg {
	uint32_t	slot;
	uint32_t	status;
	uint32_t	rkey;
	uint32_t	len;
	uint64_t	addr;
};

struct io_slot {
	int			busy;
	struct mlx5dv_mkey	*mkey;
	struct ibv_mr		*ext_mr;	/* foreign fragment, this I/O only */
	struct ibv_sge		sge[IO_MAX_SGE];
	int			nsge;
	uint32_t		wc_flags;	/* copied from the reply's completion */
	uint32_t		inv_rkey;
	struct rpc_msg		req;
	void			(*done)(struct io_slot *io, int status);
};

struct umr_conn {
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct mlx5dv_qp_ex	*mqpx;
	void			*slab_base[NSLABS];
	struct ibv_mr		*slab_mr[NSLABS];
	struct ibv_mr		*odp_mr;
	struct io_slot		ios[IO_DEPTH];
	unsigned		depth;
	unsigned		unsignaled;
	struct rpc_msg		rx[IO_RECV_DEPTH];
	struct ibv_mr		*rx_mr;
};

#define WRID(p, t)	((uint64_t)(uintptr_t)(p) | (t))

/* ------------------------------------------------------------ registration */

static struct ibv_mr *slab_reg(struct ibv_pd *pd, void *base, size_t len)
{
	struct ibv_mr *mr;

	/* the indirect mkey's remote accesses are checked against these MRs too */
	mr = ibv_reg_mr(pd, base, len, SLAB_ACCESS); /* OK: rdma-access-flags-invalid -- remote write with LOCAL_WRITE */
	if (!mr)
		return NULL;
	if (madvise(base, len, MADV_DONTFORK)) {
		perror("madvise");
		return NULL; /* BUG: rdma-mr-leak -- the slab MR is dropped when madvise fails */
	}
	return mr;
}

static int conn_setup_memory(struct umr_conn *c, struct ibv_context *ctx)
{
	struct ibv_device_attr_ex attr;
	int i;

	for (i = 0; i < NSLABS; i++) {
		c->slab_base[i] = aligned_alloc(SLAB_SIZE, SLAB_SIZE);
		c->slab_mr[i] = c->slab_base[i] ? slab_reg(c->pd, c->slab_base[i], SLAB_SIZE) : NULL;
		if (!c->slab_mr[i])
			goto unwind;
	}
	if (!ibv_query_device_ex(ctx, NULL, &attr) &&
	    (attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT))
		c->odp_mr = ibv_reg_mr(c->pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | SLAB_ACCESS); /* BUG: rdma-remote-access-overbroad -- implicit ODP MR with remote read/write covers the whole address space */
	return 0;

unwind:
	free(c->slab_base[i]);
	while (--i >= 0) {
		ibv_dereg_mr(c->slab_mr[i]); /* OK: rdma-mr-leak -- every slab registered before the failing one is released */
		c->slab_mr[i] = NULL;
		free(c->slab_base[i]);
	}
	return -ENOMEM;
}

static int conn_alloc_mkeys(struct umr_conn *c)
{
	int i;

	for (i = 0; i < IO_DEPTH; i++) {
		struct mlx5dv_mkey_init_attr mattr = {
			.pd = c->pd, .max_entries = IO_MAX_SGE,
			.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
					MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE,
		};
		c->ios[i].mkey = mlx5dv_create_mkey(&mattr); /* BUG: rdma-local-mr-management -- the ULP manages its own mkeys for remote access */
		if (!c->ios[i].mkey) {
			while (i--)
				mlx5dv_destroy_mkey(c->ios[i].mkey);
			return -errno;
		}
	}
	return 0;
}

static uint32_t conn_lkey_of(struct umr_conn *c, void *addr, size_t len)
{
	int i;

	for (i = 0; i < NSLABS; i++)
		if ((char *)addr >= (char *)c->slab_base[i] &&
		    (char *)addr + len <= (char *)c->slab_base[i] + SLAB_SIZE)
			return c->slab_mr[i]->lkey;
	return c->odp_mr ? c->odp_mr->lkey : 0;
}

/* ------------------------------------------------------------------ submit */

static void io_release(struct umr_conn *c, struct io_slot *io, int status)
{
	if (io->ext_mr) {
		ibv_dereg_mr(io->ext_mr); /* BUG: rdma-registration-in-datapath -- the per-I/O registration is torn down on every completion */
		io->ext_mr = NULL;
	}
	io->busy = 0;
	if (io->done)
		io->done(io, status);
}

int io_submit(struct umr_conn *c, struct io_slot *io, const struct iovec *iov, int iovcnt,
	      enum io_dir dir)
{
	uint32_t access, lkey;
	int k, foreign = 0, ret;

	if (io->busy || iovcnt > IO_MAX_SGE)
		return -EBUSY;
	for (k = 0; k < iovcnt; k++)
		foreign += !conn_lkey_of(c, iov[k].iov_base, iov[k].iov_len);
	if (foreign > 1)
		return -EINVAL;		/* one foreign fragment per I/O */
	io->busy = 1;
	for (k = 0; k < iovcnt; k++) {
		lkey = conn_lkey_of(c, iov[k].iov_base, iov[k].iov_len);
		if (!lkey) {
			io->ext_mr = ibv_reg_mr(c->pd, iov[k].iov_base, iov[k].iov_len, SLAB_ACCESS); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a foreign fragment is registered for every I/O */
			if (!io->ext_mr) {
				io->busy = 0;
				return -errno;
			}
			lkey = io->ext_mr->lkey;
		}
		io->sge[k] = (struct ibv_sge){ (uintptr_t)iov[k].iov_base, iov[k].iov_len, lkey };
	}
	io->nsge = iovcnt;

	access = IBV_ACCESS_REMOTE_READ;
	if (dir == IO_FROM_TARGET)
		access |= IBV_ACCESS_REMOTE_WRITE;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = WRID(io, WR_UMR);
	c->qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(c->mqpx, io->mkey, access, io->nsge, io->sge); /* BUG: rdma-access-flags-invalid, rdma-local-mr-management -- the sink layout gets REMOTE_WRITE without LOCAL_WRITE; and the ULP builds its own remote mkey */

	io->req.slot = io - c->ios;
	io->req.rkey = io->mkey->rkey;
	io->req.addr = io->sge[0].addr;
	io->req.len = dir;
	c->qpx->wr_id = WRID(io, WR_REQ);
	c->qpx->wr_flags = IBV_SEND_INLINE;
	if (c->unsignaled >= SIGNAL_EVERY) {
		c->qpx->wr_flags |= IBV_SEND_SIGNALED; /* BUG(file): rdma-unsignaled-send-starvation -- c->unsignaled is reset below but never incremented; this branch never runs */
		c->unsignaled = 0;
	}
	ibv_wr_send(c->qpx);
	ibv_wr_set_inline_data(c->qpx, &io->req, sizeof(io->req));
	ret = ibv_wr_complete(c->qpx);
	if (ret)
		io_release(c, io, -ret);	/* nothing of the batch was posted */
	return ret;
}

static int io_post_inv(struct umr_conn *c, struct io_slot *io, uint32_t flags)
{
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = WRID(io, WR_INV);
	c->qpx->wr_flags = flags;
	ibv_wr_local_inv(c->qpx, io->mkey->rkey);
	return ibv_wr_complete(c->qpx);
}

static void io_reply(struct umr_conn *c, struct io_slot *io, const struct rpc_msg *rsp)
{
	if (rsp->status) {
		if (io->wc_flags & IBV_WC_WITH_INV) {
			io_release(c, io, -(int)rsp->status); /* BUG: rdma-remote-invalidate-unchecked -- on error replies any invalidated rkey is taken as this slot's mkey */
			return;
		}
	} else if ((io->wc_flags & IBV_WC_WITH_INV) && io->inv_rkey == io->mkey->rkey) { /* OK: rdma-remote-invalidate-unchecked -- the copied invalidated rkey is compared with the mkey's */
		io_release(c, io, 0); /* OK: rdma-invalidation-leak -- the target invalidated exactly this mkey */
		return;
	}
	if (io->wc_flags & IBV_WC_WITH_INV)
		fprintf(stderr, "umr: target invalidated 0x%x, slot key 0x%x\n", io->inv_rkey, io->mkey->rkey);
	if (io_post_inv(c, io, IBV_SEND_SIGNALED))
		fprintf(stderr, "umr: LOCAL_INV failed, slot %u stays busy\n", io->req.slot);
}

void io_timeout(struct umr_conn *c, struct io_slot *io)
{
	fprintf(stderr, "umr: slot %u timed out\n", io->req.slot);
	io_release(c, io, -ETIMEDOUT); /* BUG: rdma-invalidation-leak -- the slot goes back with its mkey still mapping the fragments for the target */
}

/* application gave up on the I/O; the slot is reused by the next submit */
void io_cancel(struct umr_conn *c, struct io_slot *io)
{
	if (io_post_inv(c, io, IBV_SEND_SIGNALED))
		return;
	io_release(c, io, -ECANCELED); /* BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is signaled but nobody waits for it; the slot and fragments go back at once */
}

/* synchronous abort for callers that must own the buffers on return */
int io_abort_sync(struct umr_conn *c, struct io_slot *io)
{
	struct ibv_wc wc;
	int n;

	if (io_post_inv(c, io, IBV_SEND_SIGNALED))
		return -EIO;
	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != WRID(io, WR_INV)));
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	io_release(c, io, -ECANCELED); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- released after polling the LOCAL_INV's completion */
	return 0;
}

int conn_poll(struct umr_conn *c)
{
	struct ibv_recv_wr rwr, *bad;
	struct ibv_sge rsge;
	struct rpc_msg *rsp;
	struct io_slot *io;
	struct ibv_wc wc[16];
	int i, n;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (i = 0; i < n; i++) {
		switch (wc[i].wr_id & 7) {
		case WR_RECV:
			rsp = (struct rpc_msg *)(uintptr_t)(wc[i].wr_id & ~7ULL);
			if (wc[i].status == IBV_WC_SUCCESS && rsp->slot < IO_DEPTH) {
				io = &c->ios[rsp->slot];
				io->wc_flags = wc[i].wc_flags;
				io->inv_rkey = wc[i].invalidated_rkey;
				io_reply(c, io, rsp);
			}
			rsge = (struct ibv_sge){ (uintptr_t)rsp, sizeof(*rsp), c->rx_mr->lkey };
			rwr = (struct ibv_recv_wr){ .wr_id = WRID(rsp, WR_RECV), .sg_list = &rsge, .num_sge = 1 };
			ibv_post_recv(c->qp, &rwr, &bad);
			break;
		case WR_INV:
			io_release(c, (struct io_slot *)(uintptr_t)(wc[i].wr_id & ~7ULL), 0); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the LOCAL_INV completion */
			break;
		}
	}
	return n;
}

/* --------------------------------------------------------------- lifetime */

int conn_create_qp(struct umr_conn *c, struct ibv_context *ctx)
{
	struct mlx5dv_qp_init_attr dv = {
		.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
		.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST,
	};
	struct ibv_qp_init_attr_ex attr = {
		.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
		.pd = c->pd,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV,
	};
	struct ibv_recv_wr rwr, *bad;
	struct ibv_sge rsge;
	int i;

	/* UMR, request SEND, LOCAL_INV when the target did not invalidate */
	/* OK: rdma-send-queue-undersized -- three entries per slot cover UMR + SEND + LOCAL_INV */
	attr.cap.max_send_wr = 3 * c->depth; /* BUG(file): rdma-send-queue-manual-factor -- hand-made factor 3 for UMR and LOCAL_INV work requests */
	attr.cap.max_recv_wr = IO_RECV_DEPTH; /* BUG(file): rdma-queue-cap-unchecked -- 2048 receives requested without comparing with max_qp_wr */
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = IO_MAX_SGE * sizeof(struct ibv_sge) + 64; /* OK: rdma-queue-cap-unchecked -- the granted inline size is checked after creation */
	c->qp = mlx5dv_create_qp(ctx, &attr, &dv);
	if (!c->qp)
		return -errno;
	if (attr.cap.max_inline_data < IO_MAX_SGE * sizeof(struct ibv_sge)) {
		ibv_destroy_qp(c->qp);
		return -ENOSPC;
	}
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	c->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(c->qpx);

	c->rx_mr = ibv_reg_mr(c->pd, c->rx, sizeof(c->rx), IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- reply ring registered once for local access */
	if (!c->rx_mr)
		return -errno;
	for (i = 0; i < IO_RECV_DEPTH; i++) {
		rsge = (struct ibv_sge){ (uintptr_t)&c->rx[i], sizeof(c->rx[i]), c->rx_mr->lkey };
		rwr = (struct ibv_recv_wr){ .wr_id = WRID(&c->rx[i], WR_RECV), .sg_list = &rsge, .num_sge = 1 };
		if (ibv_post_recv(c->qp, &rwr, &bad))
			break;
	}
	return 0;
}

void conn_close(struct umr_conn *c)
{
	int i;

	for (i = 0; i < IO_DEPTH; i++)
		if (c->ios[i].mkey)
			mlx5dv_destroy_mkey(c->ios[i].mkey);
	if (c->qp)
		ibv_destroy_qp(c->qp);
	if (c->rx_mr)
		ibv_dereg_mr(c->rx_mr);
	if (c->odp_mr)
		ibv_dereg_mr(c->odp_mr);
	for (i = 0; i < NSLABS && c->slab_mr[i]; i++) {
		ibv_dereg_mr(c->slab_mr[i]);
		free(c->slab_base[i]); /* OK: rdma-invalidation-leak -- the slab is deregistered before its memory goes back */
	}
}

/* disconnect: kill every outstanding mapping and fail its I/O */
void conn_drain(struct umr_conn *c)
{
	int i;

	for (i = 0; i < IO_DEPTH; i++) {
		if (!c->ios[i].busy)
			continue;
		io_post_inv(c, &c->ios[i], 0);
		io_release(c, &c->ios[i], -ECONNRESET); /* BUG: rdma-unmap-before-invalidate -- slot and foreign fragment released right after an unsignaled LOCAL_INV */
	}
}

int conn_open(struct umr_conn *c, struct ibv_context *ctx, unsigned depth)
{
	int ret;

	memset(c, 0, sizeof(*c));
	c->depth = depth > IO_DEPTH ? IO_DEPTH : depth;
	c->pd = ibv_alloc_pd(ctx);
	c->cq = ibv_create_cq(ctx, 3 * IO_DEPTH + IO_RECV_DEPTH, NULL, NULL, 0);
	if (!c->pd || !c->cq)
		return -ENOMEM;
	if ((ret = conn_setup_memory(c, ctx)) || (ret = conn_alloc_mkeys(c)) ||
	    (ret = conn_create_qp(c, ctx)))
		conn_close(c);
	return ret;
}
