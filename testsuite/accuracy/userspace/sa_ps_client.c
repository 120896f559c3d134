/*
 * sa_ps_client.c - worker-side client of a parameter server for data-parallel
 * training, one RC connection per server shard.
 *
 * Every tensor has a private buffer registered LOCAL_WRITE | MW_BIND and a
 * type-2 memory window.  At the start of a step the worker binds the window
 * over the tensor under a fresh key (ibv_inc_rkey) and sends PS_OP_EXPOSE;
 * the worker then RDMA-WRITEs its gradients into the server's slot, and the
 * server writes the aggregated parameters back through the window and ends
 * with PS_OP_PARAMS_DONE sent as SEND_WITH_INV of the window key.  Posting
 * uses the extended QP API (ibv_wr_*).  On mlx5 devices tensor buffers are
 * registered with relaxed ordering.
 *
 * Wrong: the retry path re-binds a window under the key of the failed
 * attempt; a step that times out marks its tensors idle while their windows
 * stay bound; pruning a tensor frees its buffer right after an unsignaled
 * LOCAL_INV; a sparse push leaks its staging registration when the post
 * fails.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked, rdma-remote-invalidate-unchecked -- not covered by this review
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define PS_MAX_TENSORS		64
#define PS_STEP_TIMEOUT_S	30

enum { PS_T_IDLE, PS_T_EXPOSED, PS_T_DROPPED };
enum { PS_OP_EXPOSE = 1, PS_OP_PARAMS_DONE, PS_OP_RETRY, PS_OP_DROP };

struct ps_msg {
	uint32_t op;
	uint32_t tensor;
	uint32_t rkey;
	uint32_t status;
	uint64_t addr;
	uint64_t len;
};

typedef struct {
	char		 name[32];
	float		*data;
	size_t		 bytes;
	struct ibv_mr	*mr;
	struct ibv_mw	*mw;
	uint32_t	 rkey;
	int		 state;
	time_t		 deadline;
	uint64_t	 grad_addr;	/* server slot for this tensor's gradients */
	uint32_t	 grad_rkey;
} ps_tensor_t;

typedef struct {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	int			 reg_flags;
	ps_tensor_t		 tensors[PS_MAX_TENSORS];
	int			 ntensors;
	uint64_t		 wr_seq;
} ps_client_t;

static void ps_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("ps-client: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static int ps_poll_wr(ps_client_t *c, uint64_t id)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
	} while (n == 0 || wc.wr_id != id);
	return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
}

static int ps_bind_window(ps_client_t *c, ps_tensor_t *t, uint32_t key)
{
	struct ibv_mw_bind_info bi = {
		.mr = t->mr,
		.addr = (uintptr_t)t->data,
		.length = t->bytes,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	uint64_t id = ++c->wr_seq;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = id;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(c->qpx, t->mw, key, &bi);
	if (ibv_wr_complete(c->qpx))
		return -EIO;
	return ps_poll_wr(c, id);
}

static int ps_local_inv_sync(ps_client_t *c, ps_tensor_t *t)
{
	uint64_t id = ++c->wr_seq;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = id;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(c->qpx, t->rkey);
	if (ibv_wr_complete(c->qpx))
		return -EIO;
	return ps_poll_wr(c, id);
}

static int ps_send(ps_client_t *c, uint32_t op, int idx)
{
	ps_tensor_t *t = &c->tensors[idx];
	struct ps_msg m = {
		.op = op, .tensor = (uint32_t)idx, .rkey = t->rkey,
		.addr = (uintptr_t)t->data, .len = t->bytes,
	};
	uint64_t id = ++c->wr_seq;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = id;
	c->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(c->qpx);
	ibv_wr_set_inline_data(c->qpx, &m, sizeof(m));
	if (ibv_wr_complete(c->qpx))
		return -EIO;
	return ps_poll_wr(c, id);
}

static int ps_tensor_register(ps_client_t *c, ps_tensor_t *t, size_t bytes)
{
	t->data = aligned_alloc(64, bytes);
	if (!t->data)
		return -ENOMEM;
	t->bytes = bytes;
	t->mr = ibv_reg_mr(c->pd, t->data, bytes,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND | c->reg_flags);
	if (!t->mr)
		goto err_data;
	t->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
	if (!t->mw)
		goto err_mr;

	/* expose right away so the server can push the initial weights */
	t->rkey = t->mw->rkey;
	if (ps_bind_window(c, t, t->rkey))	/* OK: rdma-rkey-reuse -- first bind of a window allocated just above; no peer has seen this key */
		goto err_mw;
	t->state = PS_T_EXPOSED;
	t->deadline = time(NULL) + PS_STEP_TIMEOUT_S;
	return 0;

err_mw:
	ibv_dealloc_mw(t->mw);
err_mr:
	ibv_dereg_mr(t->mr);
err_data:
	free(t->data);
	t->data = NULL;
	return -EIO;
}

static void ps_tensor_unregister(ps_client_t *c, ps_tensor_t *t)
{
	(void)c;
	if (t->mw) {
		ibv_dealloc_mw(t->mw);
		t->mw = NULL;
	}
	if (t->mr) {
		ibv_dereg_mr(t->mr);
		t->mr = NULL;
	}
	free(t->data);		/* OK: rdma-invalidation-leak -- deallocating the window killed its key before the buffer goes */
	t->data = NULL;
	t->state = PS_T_DROPPED;
}

int ps_register_all(ps_client_t *c, const size_t *sizes, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		ps_tensor_t *t = &c->tensors[i];

		snprintf(t->name, sizeof(t->name), "t%d", i);
		if (ps_tensor_register(c, t, sizes[i]))
			goto unwind;
		if (ps_send(c, PS_OP_EXPOSE, i)) {
			ps_tensor_unregister(c, t);
			goto unwind;	/* OK: rdma-mr-leak -- tensor i was released before the jump; the loop below takes the rest */
		}
	}
	c->ntensors = n;
	return 0;

unwind:
	while (--i >= 0)
		ps_tensor_unregister(c, &c->tensors[i]);
	return -EIO;
}

int ps_step_begin(ps_client_t *c)
{
	int i;

	for (i = 0; i < c->ntensors; i++) {
		ps_tensor_t *t = &c->tensors[i];

		if (t->state != PS_T_IDLE)
			continue;
		t->rkey = ibv_inc_rkey(t->rkey);
		if (ps_bind_window(c, t, t->rkey))	/* OK: rdma-rkey-reuse -- a new key every step */
			return -EIO;
		t->state = PS_T_EXPOSED;
		t->deadline = time(NULL) + PS_STEP_TIMEOUT_S;
		if (ps_send(c, PS_OP_EXPOSE, i))
			return -EIO;
	}
	return 0;
}

static int ps_window_is_dead(ps_client_t *c, ps_tensor_t *t, const struct ibv_wc *wc)
{
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == t->rkey)
		return 0;
	if (wc->wc_flags & IBV_WC_WITH_INV)
		ps_log("%s: server invalidated %#x, expected %#x", t->name,
		       wc->invalidated_rkey, t->rkey);
	return ps_local_inv_sync(c, t);
}

int ps_on_message(ps_client_t *c, const struct ibv_wc *wc, const struct ps_msg *m)
{
	ps_tensor_t *t;
	int rc;

	if (m->tensor >= (uint32_t)c->ntensors)
		return -EINVAL;
	t = &c->tensors[m->tensor];
	if (t->state != PS_T_EXPOSED)
		return 0;

	rc = ps_window_is_dead(c, t, wc);
	if (rc)
		return rc;

	switch (m->op) {
	case PS_OP_PARAMS_DONE:
		t->state = PS_T_IDLE;	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the key was checked dead or the LOCAL_INV completed */
		return 0;
	case PS_OP_RETRY:
		/* the server lost our push; let it resend with the key it has */
		rc = ps_bind_window(c, t, t->rkey);	/* BUG: rdma-rkey-reuse -- the window is bound again under the previous attempt's key */
		if (rc)
			return rc;
		t->deadline = time(NULL) + PS_STEP_TIMEOUT_S;
		return 0;
	default:
		return -EINVAL;
	}
}

void ps_step_timeout(ps_client_t *c)
{
	time_t now = time(NULL);
	int i;

	for (i = 0; i < c->ntensors; i++) {
		ps_tensor_t *t = &c->tensors[i];

		if (t->state == PS_T_EXPOSED && now > t->deadline) {
			ps_log("%s: no parameters from the server, skipping step", t->name);
			t->state = PS_T_IDLE;	/* BUG: rdma-invalidation-leak -- the window is still bound and the server holds its key; the optimizer reuses the buffer */
		}
	}
}

/* Pruning: the tensor leaves the model. */
void ps_tensor_drop(ps_client_t *c, int idx)
{
	ps_tensor_t *t = &c->tensors[idx];

	if (t->state == PS_T_EXPOSED) {
		ibv_wr_start(c->qpx);
		c->qpx->wr_id = 0;
		c->qpx->wr_flags = 0;
		ibv_wr_local_inv(c->qpx, t->rkey);
		if (ibv_wr_complete(c->qpx)) {
			ps_log("%s: LOCAL_INV post failed, tensor kept", t->name);
			return;
		}
	}
	free(t->data);		/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV has not been seen complete when the buffer goes */
	t->data = NULL;
	t->state = PS_T_DROPPED;
	ps_send(c, PS_OP_DROP, idx);
}

int ps_tensor_resize(ps_client_t *c, ps_tensor_t *t, size_t bytes)
{
	int rc;

	if (t->state == PS_T_EXPOSED) {
		rc = ps_local_inv_sync(c, t);
		if (rc)
			return rc;
		t->state = PS_T_IDLE;	/* OK: rdma-invalidation-leak -- the window's LOCAL_INV completed */
	}
	ibv_dereg_mr(t->mr);
	free(t->data);		/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completed above */
	t->data = aligned_alloc(64, bytes);
	if (!t->data) {
		t->mr = NULL;
		return -ENOMEM;
	}
	t->bytes = bytes;
	/* OK: rdma-mr-leak -- the old MR was deregistered above */
	t->mr = ibv_reg_mr(c->pd, t->data, bytes,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND | c->reg_flags);
	return t->mr ? 0 : -errno;
}

/* Sparse embedding gradients: packed into a staging buffer and written out. */
int ps_push_sparse(ps_client_t *c, ps_tensor_t *t, const uint32_t *rows,
		   const float *vals, size_t n)
{
	size_t bytes = n * (sizeof(*rows) + sizeof(*vals));
	struct ibv_mr *mr;
	uint64_t id;
	char *stage;

	stage = malloc(bytes);
	if (!stage)
		return -ENOMEM;
	memcpy(stage, rows, n * sizeof(*rows));
	memcpy(stage + n * sizeof(*rows), vals, n * sizeof(*vals));
	mr = ibv_reg_mr(c->pd, stage, bytes, 0);
	if (!mr) {
		free(stage);
		return -errno;
	}

	id = ++c->wr_seq;
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = id;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(c->qpx, t->grad_rkey, t->grad_addr);
	ibv_wr_set_sge(c->qpx, mr->lkey, (uintptr_t)stage, (uint32_t)bytes);
	if (ibv_wr_complete(c->qpx)) {
		free(stage);	/* OK: rdma-invalidation-leak -- the staging MR has no remote rights */
		return -EIO;	/* BUG: rdma-mr-leak -- the staging registration is never deregistered on this path */
	}
	if (ps_poll_wr(c, id))
		ps_log("%s: sparse push failed", t->name);
	ibv_dereg_mr(mr);
	free(stage);
	return 0;
}

int ps_client_open(ps_client_t *c, struct ibv_device *dev)
{
	struct ibv_qp_init_attr_ex qa;

	memset(c, 0, sizeof(*c));
	c->ctx = ibv_open_device(dev);
	if (!c->ctx)
		return -ENODEV;
	if (mlx5dv_is_supported(dev))
		c->reg_flags = IBV_ACCESS_RELAXED_ORDERING;
	c->pd = ibv_alloc_pd(c->ctx);
	c->cq = c->pd ? ibv_create_cq(c->ctx, 512, NULL, NULL, 0) : NULL;
	if (!c->cq)
		return -ENOMEM;

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = qa.recv_cq = c->cq;
	qa.cap.max_send_wr = 256;
	qa.cap.max_recv_wr = 256;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = sizeof(struct ps_msg);
	qa.pd = c->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	c->qp = ibv_create_qp_ex(c->ctx, &qa);
	if (!c->qp)
		return -errno;
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	return 0;
}

void ps_client_close(ps_client_t *c)
{
	int i;

	/* pruned tensors keep their window and MR until here */
	for (i = 0; i < c->ntensors; i++)
		ps_tensor_unregister(c, &c->tensors[i]);
	ibv_destroy_qp(c->qp);
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->pd);
	ibv_close_device(c->ctx);
}
