/*
 * ub_mpi_rma.c - RDMA one-sided component of a small MPI runtime: MPI_Win
 * creation over user memory, MPI_Win_allocate, dynamic windows, passive
 * target lock/unlock with remote CAS on a lock word behind the window,
 * MPI_Put, and PSCW (post/start/complete/wait) exposure epochs.
 *
 * Every window registers its memory once and allgathers {base, size, rkey}
 * through the PMI layer (other unit).  PSCW epochs expose the window to each
 * origin through a type-2 memory window bound on that origin's QP; the
 * origin ends its access epoch with SEND_WITH_INV of that window's rkey and
 * the target checks the invalidation in MPI_Win_wait, fencing the windows
 * the origins did not invalidate with a signaled LOCAL_INV.  Dynamic windows
 * use one implicit ODP registration.
 *
 * Not right: atomics without local write for read-only windows, implicit
 * ODP with remote rights, a remote-readable CAS result buffer, a send queue
 * sized by a hand-made factor, inline data never compared with the device,
 * window rebinding with a stale key, an unchecked remote invalidation in
 * MPI_Win_wait (MPI_Win_test compares), MR leak and freed memory on the
 * allgather error path, and MPI_Win_free freeing the window memory right
 * after unsignaled LOCAL_INVs and before deregistration.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define RMA_WR_PER_OP		3	/* worst case: BIND_MW + POST SEND + LOCAL_INV */
#define RMA_INLINE		128
#define RMA_SIG_INTERVAL	64
#define RMA_CTRL_BYTES		64	/* lock word and padding behind the window */
#define RMA_LOCK_EXCL		(1ull << 63)
#define RMA_ERR_OTHER		15

/* PMI layer (pmi.c) */
extern int pmi_allgather(const void *in, void *out, size_t len);
extern int pmi_barrier(void);

enum rma_flavor { WIN_CREATE, WIN_ALLOCATE, WIN_DYNAMIC };
enum { RMA_WR_PUT = 1, RMA_WR_ATOMIC, RMA_WR_POST, RMA_WR_INV, RMA_WR_FLUSH };
enum { CTRL_POST = 1, CTRL_DONE };

struct rma_info {
	int hw_accumulate;	/* "accumulate_ops" allows NIC atomics */
	int read_only;		/* no MPI_Put/Accumulate target */
};

struct rma_peer_key { uint64_t base, size; uint32_t rkey, disp_unit; };
struct rma_ctrl_msg { uint32_t type, rank, rkey, pad; uint64_t base; };

struct rma_ep {
	struct ibv_qp *qp;
	uint32_t unsig;
};

struct rma_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int rank, nranks;
	unsigned int max_outstanding;	/* operations in flight per peer */
	struct rma_ep *eps;
};

/* per-origin PSCW exposure */
struct rma_pscw {
	struct ibv_mw *mw;
	uint32_t rkey;
	int exposed;
	struct ibv_send_wr bind_wr, post_wr;
	struct ibv_sge post_sge;
};

struct rma_win {
	struct rma_dev *dev;
	enum rma_flavor flavor;
	void *base;
	size_t size;
	int disp_unit, read_only;
	struct ibv_mr *mr;
	struct rma_peer_key *peers;
	uint64_t *cas_result;
	struct ibv_mr *cas_mr;
	struct rma_ctrl_msg *ctrl;	/* [0, nranks): send, [nranks, 2*nranks): recv */
	struct ibv_mr *ctrl_mr;
	struct rma_pscw *pscw;
};

int rma_ep_create(struct rma_dev *dev, int peer)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = dev->cq,
		.recv_cq = dev->cq,
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = RMA_WR_PER_OP * dev->max_outstanding, // BUG(file): rdma-send-queue-manual-factor -- hand-made factor 3 for the window's BIND_MW and LOCAL_INV
			.max_recv_wr = 64,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = RMA_INLINE, // BUG(file): rdma-queue-cap-unchecked -- 128 bytes of inline data, never compared with what the device grants
		},
	};

	dev->eps[peer].qp = ibv_create_qp(dev->pd, &attr);
	return dev->eps[peer].qp ? 0 : -errno;
}

static int rma_win_access(const struct rma_info *info)
{
	int acc = IBV_ACCESS_REMOTE_READ;

	if (info->hw_accumulate)
		acc |= IBV_ACCESS_REMOTE_ATOMIC;
	if (!info->read_only)
		acc |= IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	return acc;
}

static int rma_post_ctrl_recv(struct rma_win *win, int peer)
{
	struct rma_ctrl_msg *m = &win->ctrl[win->dev->nranks + peer];
	struct ibv_sge sge = { (uintptr_t)m, sizeof(*m), win->ctrl_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)peer, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(win->dev->eps[peer].qp, &wr, &bad);
}

/* window memory: allocated here for MPI_Win_allocate, registered once */
static int rma_win_register(struct rma_win *win, void *base, const struct rma_info *info)
{
	if (win->flavor == WIN_ALLOCATE &&
	    posix_memalign(&base, 4096, win->size + RMA_CTRL_BYTES))
		return -ENOMEM;
	win->base = base;
	/* BUG: rdma-local-mr-management -- window memory whose rkey every peer receives */
	win->mr = ibv_reg_mr(win->dev->pd, base, win->size + RMA_CTRL_BYTES,
			     rma_win_access(info) | IBV_ACCESS_MW_BIND); // BUG: rdma-access-flags-invalid -- a read-only window with hw_accumulate asks for REMOTE_ATOMIC without LOCAL_WRITE
	if (!win->mr) {
		if (win->flavor == WIN_ALLOCATE)
			free(base); /* OK: rdma-invalidation-leak -- the registration failed, no key exists */
		win->base = NULL;
		return -errno;
	}
	return 0;
}

/* CAS result word, control messages */
static int rma_win_setup_ctrl(struct rma_win *win)
{
	int n = win->dev->nranks;

	win->cas_result = aligned_alloc(64, 64);
	win->ctrl = calloc(2 * n, sizeof(*win->ctrl));
	win->pscw = calloc(n, sizeof(*win->pscw));
	win->peers = calloc(n, sizeof(*win->peers));
	if (!win->cas_result || !win->ctrl || !win->pscw || !win->peers)
		return -ENOMEM;		/* the caller unwinds what was set up */
	win->cas_mr = ibv_reg_mr(win->dev->pd, win->cas_result, 64,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); // BUG(file): rdma-remote-access-overbroad -- the CAS result buffer's rkey is never sent anywhere
	/* OK: rdma-local-mr-management -- control messages: local access, registered once per window */
	win->ctrl_mr = ibv_reg_mr(win->dev->pd, win->ctrl, 2 * n * sizeof(*win->ctrl),
				  IBV_ACCESS_LOCAL_WRITE);
	return win->cas_mr && win->ctrl_mr ? 0 : -ENOMEM; /* OK: rdma-mr-leak -- the caller's unwinding deregisters whichever of the two MRs was registered */
}

/* PSCW: one type-2 window per origin, each bound on that origin's QP */
static int rma_win_alloc_windows(struct rma_win *win)
{
	int i;

	for (i = 0; i < win->dev->nranks; i++) {
		if (i == win->dev->rank)
			continue;
		win->pscw[i].mw = ibv_alloc_mw(win->dev->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- one memory window per origin for PSCW exposure
		if (!win->pscw[i].mw)
			return -ENOMEM; /* OK: rdma-mr-leak -- the caller deallocates every window it finds in win->pscw */
		win->pscw[i].rkey = win->pscw[i].mw->rkey;
		rma_post_ctrl_recv(win, i);
	}
	return 0;
}

int rma_win_create(struct rma_dev *dev, void *base, size_t size, int disp_unit,
		   const struct rma_info *info, enum rma_flavor flavor, struct rma_win **out)
{
	struct rma_peer_key me;
	struct rma_win *win;
	int i, ret;

	win = calloc(1, sizeof(*win));
	if (!win)
		return -ENOMEM;
	win->dev = dev;
	win->flavor = flavor;
	win->size = size;
	win->disp_unit = disp_unit;
	win->read_only = info->read_only;
	ret = rma_win_register(win, base, info);
	if (ret) {
		free(win);
		return ret;
	}
	if (rma_win_setup_ctrl(win) || rma_win_alloc_windows(win))
		goto err;

	me.base = (uintptr_t)win->base;
	me.size = size;
	me.rkey = win->mr->rkey; /* OK: rdma-remote-access-overbroad -- the window's rights are what the peers use with this key */
	me.disp_unit = disp_unit;
	if (pmi_allgather(&me, win->peers, sizeof(me)))
		goto err;
	*out = win;
	return 0;

err:
	for (i = 0; win->pscw && i < dev->nranks; i++)
		if (win->pscw[i].mw)
			ibv_dealloc_mw(win->pscw[i].mw);
	if (win->ctrl_mr)
		ibv_dereg_mr(win->ctrl_mr);
	if (win->cas_mr)
		ibv_dereg_mr(win->cas_mr);
	free(win->peers);
	free(win->pscw);
	free(win->ctrl);
	free(win->cas_result);
	if (flavor == WIN_ALLOCATE)
		free(win->base); // BUG: rdma-invalidation-leak -- after a failed allgather some peers may hold the rkey, and the memory is freed with the MR still registered
	free(win);
	return -RMA_ERR_OTHER; // BUG: rdma-mr-leak -- the unwinding releases everything but win->mr
}

/* MPI_Win_create_dynamic: memory is attached later, anywhere in the process */
int rma_win_create_dynamic(struct rma_dev *dev, struct rma_win **out)
{
	struct rma_peer_key me = { 0 };
	struct rma_win *win = calloc(1, sizeof(*win));

	if (!win)
		return -ENOMEM;
	win->dev = dev;
	win->flavor = WIN_DYNAMIC;
	win->peers = calloc(dev->nranks, sizeof(*win->peers));
	/* BUG: rdma-local-mr-management -- implicit registration whose rkey goes to every peer */
	win->mr = ibv_reg_mr(dev->pd, NULL, SIZE_MAX,
			     IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
			     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE); // BUG(file): rdma-remote-access-overbroad -- implicit ODP with remote rights exposes the whole address space
	if (!win->mr || !win->peers) {
		if (win->mr)
			ibv_dereg_mr(win->mr);
		free(win->peers);
		free(win);
		return -ENOTSUP;
	}
	me.size = UINT64_MAX;
	me.rkey = win->mr->rkey;
	if (pmi_allgather(&me, win->peers, sizeof(me))) {
		ibv_dereg_mr(win->mr); /* OK: rdma-mr-leak -- the implicit MR is released on the error path */
		free(win->peers);
		free(win);
		return -RMA_ERR_OTHER;
	}
	*out = win;
	return 0;
}

static int rma_wait_wrid(struct rma_dev *dev, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(dev->cq, 1, &wc);
		if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS))
			return -EIO;
	} while (n == 0 || wc.wr_id != wr_id);
	return 0;
}

/* passive target: spin on a remote CAS of the lock word */
int rma_win_lock(struct rma_win *win, int target, int exclusive)
{
	struct rma_peer_key *pk = &win->peers[target];
	struct ibv_sge sge = { (uintptr_t)win->cas_result, 8, win->cas_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = RMA_WR_ATOMIC,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	wr.wr.atomic.remote_addr = pk->base + pk->size;
	wr.wr.atomic.rkey = pk->rkey;
	wr.wr.atomic.compare_add = 0;
	wr.wr.atomic.swap = exclusive ? RMA_LOCK_EXCL : 1;
	do {
		if (ibv_post_send(win->dev->eps[target].qp, &wr, &bad) ||
		    rma_wait_wrid(win->dev, RMA_WR_ATOMIC))
			return -EIO;
	} while (*win->cas_result != 0);
	return 0;
}

/* MPI_Win_unlock: complete the puts to target, then drop the lock */
int rma_win_unlock(struct rma_win *win, int target, int exclusive)
{
	struct rma_peer_key *pk = &win->peers[target];
	struct ibv_sge sge = { (uintptr_t)win->cas_result, 8, win->cas_mr->lkey };
	struct ibv_send_wr flush = {
		.wr_id = RMA_WR_FLUSH, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
	}, rel = {
		.wr_id = RMA_WR_ATOMIC, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	/* a zero-length READ is ordered behind the outstanding writes */
	flush.wr.rdma.remote_addr = pk->base;
	flush.wr.rdma.rkey = pk->rkey;
	rel.wr.atomic.remote_addr = pk->base + pk->size;
	rel.wr.atomic.rkey = pk->rkey;
	rel.wr.atomic.compare_add = exclusive ? -RMA_LOCK_EXCL : (uint64_t)-1;
	if (ibv_post_send(win->dev->eps[target].qp, &flush, &bad) ||
	    rma_wait_wrid(win->dev, RMA_WR_FLUSH))
		return -EIO;
	win->dev->eps[target].unsig = 0;
	if (ibv_post_send(win->dev->eps[target].qp, &rel, &bad))
		return -EIO;
	return rma_wait_wrid(win->dev, RMA_WR_ATOMIC);
}

int rma_put(struct rma_win *win, const void *origin, size_t len, int target, uint64_t disp)
{
	struct rma_ep *ep = &win->dev->eps[target];
	struct ibv_sge sge = { (uintptr_t)origin, (uint32_t)len, win->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = RMA_WR_PUT, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
	}, *bad;

	if ((const char *)origin < (const char *)win->base ||
	    (const char *)origin + len > (const char *)win->base + win->size)
		return -EINVAL;		/* origin must live in the window */
	wr.wr.rdma.remote_addr = win->peers[target].base + disp * win->peers[target].disp_unit;
	wr.wr.rdma.rkey = win->peers[target].rkey;
	/* OK: rdma-unsignaled-send-starvation -- the per-peer counter advances with every put */
	if (++ep->unsig == RMA_SIG_INTERVAL) {
		wr.send_flags = IBV_SEND_SIGNALED;
		ep->unsig = 0;
	}
	return ibv_post_send(ep->qp, &wr, &bad);
}

/* MPI_Win_post: expose the window to each origin of the group */
int rma_win_post(struct rma_win *win, const int *origins, int n)
{
	struct ibv_send_wr *bad;
	int i, o;

	if (win->flavor == WIN_DYNAMIC)
		return -ENOTSUP;	/* no PSCW exposure on dynamic windows */
	for (i = 0; i < n; i++) {
		struct rma_pscw *x = &win->pscw[origins[i]];
		struct rma_ctrl_msg *m = &win->ctrl[origins[i]];

		o = origins[i];
		memset(&x->bind_wr, 0, sizeof(x->bind_wr));
		x->bind_wr.wr_id = RMA_WR_POST;
		x->bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-epoch window bind managed by the runtime
		x->bind_wr.bind_mw.mw = x->mw;
		x->bind_wr.bind_mw.rkey = x->rkey; // BUG: rdma-rkey-reuse -- x->rkey is never rotated: every epoch exposes the window under the origin's previous key
		x->bind_wr.bind_mw.bind_info.mr = win->mr;
		x->bind_wr.bind_mw.bind_info.addr = (uintptr_t)win->base;
		x->bind_wr.bind_mw.bind_info.length = win->size;
		x->bind_wr.bind_mw.bind_info.mw_access_flags = win->read_only ? IBV_ACCESS_REMOTE_READ :
			IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- write windows only on writable windows, whose MR has LOCAL_WRITE */
		x->bind_wr.next = &x->post_wr;

		m->type = CTRL_POST;
		m->rank = win->dev->rank;
		m->rkey = x->rkey;
		m->base = (uintptr_t)win->base;
		x->post_sge = (struct ibv_sge){ (uintptr_t)m, sizeof(*m), win->ctrl_mr->lkey };
		memset(&x->post_wr, 0, sizeof(x->post_wr));
		x->post_wr.wr_id = RMA_WR_POST;
		x->post_wr.opcode = IBV_WR_SEND;
		x->post_wr.sg_list = &x->post_sge;
		x->post_wr.num_sge = 1;
		x->post_wr.send_flags = IBV_SEND_SIGNALED;
		if (ibv_post_send(win->dev->eps[o].qp, &x->bind_wr, &bad))
			return -EIO;
		x->exposed = 1;
	}
	return 0;
}

static int rma_post_mw_inv(struct rma_win *win, int peer, unsigned int flags)
{
	struct ibv_send_wr wr = {
		.wr_id = RMA_WR_INV, .opcode = IBV_WR_LOCAL_INV, .send_flags = flags,
		.invalidate_rkey = win->pscw[peer].rkey,
	}, *bad;

	return ibv_post_send(win->dev->eps[peer].qp, &wr, &bad);
}

/* MPI_Win_wait: every origin of the epoch reports CTRL_DONE with SEND_WITH_INV */
int rma_win_wait(struct rma_win *win, int norigins)
{
	struct ibv_wc wc;
	int done = 0, p, n;

	while (done < norigins) {
		n = ibv_poll_cq(win->dev->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 0 || wc.opcode != IBV_WC_RECV)
			continue;
		p = (int)wc.wr_id;
		if (win->ctrl[win->dev->nranks + p].type == CTRL_DONE) {
			if (wc.wc_flags & IBV_WC_WITH_INV)
				win->pscw[p].exposed = 0; // BUG: rdma-remote-invalidate-unchecked -- whichever key the origin invalidated, this origin's window is taken as fenced
			done++;
		}
		rma_post_ctrl_recv(win, p);
	}
	for (p = 0; p < win->dev->nranks; p++) {
		if (!win->pscw[p].exposed)
			continue;
		if (rma_post_mw_inv(win, p, IBV_SEND_SIGNALED) ||
		    rma_wait_wrid(win->dev, RMA_WR_INV))
			return -EIO;
		win->pscw[p].exposed = 0;
	}
	return 0;
}

/* MPI_Win_test: non-blocking MPI_Win_wait */
int rma_win_test(struct rma_win *win, int *remaining)
{
	struct ibv_wc wc;
	int p;

	while (*remaining > 0 && ibv_poll_cq(win->dev->cq, 1, &wc) == 1) {
		if (wc.opcode != IBV_WC_RECV)
			continue;
		p = (int)wc.wr_id;
		if (win->ctrl[win->dev->nranks + p].type == CTRL_DONE) {
			if ((wc.wc_flags & IBV_WC_WITH_INV) &&
			    wc.invalidated_rkey == win->pscw[p].rkey) /* OK: rdma-remote-invalidate-unchecked -- only this origin's window key counts as fenced */
				win->pscw[p].exposed = 0;
			(*remaining)--;
		}
		rma_post_ctrl_recv(win, p);
	}
	return *remaining ? 0 : 1;	/* the caller fences leftovers as MPI_Win_wait does */
}

int rma_win_free(struct rma_win *win)
{
	int p;

	pmi_barrier();		/* every origin has finished its epochs */
	for (p = 0; p < win->dev->nranks; p++) {
		if (win->pscw && win->pscw[p].exposed) {
			rma_post_mw_inv(win, p, 0);
			win->pscw[p].exposed = 0;
		}
	}
	if (win->flavor == WIN_ALLOCATE)
		free(win->base); // BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- window memory freed right after unsignaled LOCAL_INVs and before the MR that peers hold a key for is deregistered
	for (p = 0; win->pscw && p < win->dev->nranks; p++)
		if (win->pscw[p].mw)
			ibv_dealloc_mw(win->pscw[p].mw);
	if (win->cas_mr)
		ibv_dereg_mr(win->cas_mr);
	free(win->cas_result);
	if (win->ctrl_mr)
		ibv_dereg_mr(win->ctrl_mr);
	ibv_dereg_mr(win->mr);
	free(win->ctrl);
	free(win->pscw);
	free(win->peers);
	free(win);
	return 0;
}
