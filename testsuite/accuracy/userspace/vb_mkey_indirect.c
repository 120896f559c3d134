/*
 * vb_mkey_indirect.c - NVMe-oF style target queue pair that hands the host
 * one mlx5 indirect mkey per command, laid over the command's scattered
 * pool buffers (SPDK accel/mlx5 flavour: spdk_-like naming, STAILQ-free
 * singly linked free lists, handles kept in the qpair and released by
 * mk_qpair_destroy()).
 *
 * Per command: a UMR (mlx5dv_wr_mr_list, inline) configures the command's
 * mkey over its buffers, the response SEND carries the mkey's rkey, and when
 * the host's RELEASE capsule arrives a signaled LOCAL_INV kills the key; the
 * buffers go back to the pool on that completion.  Responses are signaled
 * every MK_SIGNAL_EVERY commands.  Backends may hand us their own iovecs
 * ("external" buffers), which are registered for the command.
 *
 * Known problems: the host-write UMR asks for remote write without local
 * write; the send queue is sized for 2 WRs per command where a command
 * keeps UMR, SEND and LOCAL_INV; external buffers are registered and
 * deregistered per command; mk_qpair_alloc_bufs() leaks the data MR when the
 * command ring fails to register, and nothing ever deregisters meta_mr.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-rkey-reuse, rdma-remote-invalidate-unchecked, rdma-access-flags-transport, rdma-send-queue-manual-factor, rdma-remote-access-overbroad -- not the subject of this file
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define MK_MAX_SGE		8
#define MK_BUF_SIZE		8192
#define MK_POOL_BUFS		1024
#define MK_RECV_DEPTH		4096
#define MK_SIGNAL_EVERY		16
#define MK_SENSE_SIZE		256

#define MK_CMD_HOST_WRITE	0x1	/* host writes into our buffers */
#define MK_CMD_RELEASE		0x2	/* host is done with the mkey */

#define MK_WRID_INV		0x1UL

struct mk_cmd {
	uint16_t cid;
	uint8_t opc;
	uint8_t flags;
	uint32_t len;
};

struct mk_rsp {
	uint16_t cid;
	uint16_t status;
	uint32_t rkey;
	uint64_t addr;
	uint32_t len;
	uint32_t tag;	/* RELEASE capsules echo it in cid */
};

struct mk_qpair;

struct mk_req {
	struct mk_qpair *qp;
	struct mlx5dv_mkey *mkey;
	struct ibv_sge sgl[MK_MAX_SGE];
	uint32_t bufs[MK_MAX_SGE];
	uint16_t nsge;
	uint16_t cid;
	struct ibv_mr *ext_mr[MK_MAX_SGE];
	uint16_t n_ext;
	struct mk_req *next_free;
} __attribute__((aligned(8)));

struct mk_qpair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct mlx5dv_qp_ex *mqpx;
	struct ibv_device_attr_ex dattr;
	uint32_t depth;
	uint32_t since_signal;

	char *data_pool;
	struct ibv_mr *data_mr;
	uint32_t buf_stack[MK_POOL_BUFS];
	uint32_t nfree;

	struct mk_cmd *cmd_ring;
	struct ibv_mr *cmd_mr;
	struct mk_rsp *rsp_ring;
	struct ibv_mr *meta_mr;
	char *sense;
	struct ibv_mr *sense_mr;

	struct mk_req *reqs;
	struct mk_req *free_reqs;
};

static void mk_free_rings(struct mk_qpair *qp)
{
	free(qp->rsp_ring);
	free(qp->cmd_ring);
	free(qp->data_pool);
	qp->rsp_ring = NULL;
	qp->cmd_ring = NULL;
	qp->data_pool = NULL;
}

static int mk_qpair_alloc_bufs(struct mk_qpair *qp)
{
	size_t pool_len = (size_t)MK_POOL_BUFS * MK_BUF_SIZE;
	int err;

	qp->data_pool = aligned_alloc(4096, pool_len);
	qp->cmd_ring = calloc(MK_RECV_DEPTH, sizeof(*qp->cmd_ring));
	qp->rsp_ring = calloc(qp->depth, sizeof(*qp->rsp_ring));
	if (!qp->data_pool || !qp->cmd_ring || !qp->rsp_ring) {
		mk_free_rings(qp);
		return -ENOMEM;
	}

	qp->data_mr = ibv_reg_mr(qp->pd, qp->data_pool, pool_len, IBV_ACCESS_LOCAL_WRITE);
	if (!qp->data_mr) {
		err = errno;
		mk_free_rings(qp);
		return -err;	// OK: rdma-mr-leak -- nothing registered yet
	}
	qp->cmd_mr = ibv_reg_mr(qp->pd, qp->cmd_ring, MK_RECV_DEPTH * sizeof(*qp->cmd_ring),
				IBV_ACCESS_LOCAL_WRITE);
	if (!qp->cmd_mr) {
		mk_free_rings(qp);
		return -ENOMEM;	// BUG: rdma-mr-leak -- qp->data_mr stays registered (over a freed pool); the caller only frees the qpair
	}
	/* BUG(file): rdma-mr-leak -- meta_mr is never deregistered, mk_qpair_destroy() forgets it */
	qp->meta_mr = ibv_reg_mr(qp->pd, qp->rsp_ring, qp->depth * sizeof(*qp->rsp_ring), 0);
	if (!qp->meta_mr) {
		ibv_dereg_mr(qp->cmd_mr);
		ibv_dereg_mr(qp->data_mr);
		mk_free_rings(qp);
		return -ENOMEM;	// OK: rdma-mr-leak -- both earlier MRs are released
	}

	for (qp->nfree = 0; qp->nfree < MK_POOL_BUFS; qp->nfree++)
		qp->buf_stack[qp->nfree] = qp->nfree;
	return 0;
}

static int mk_qpair_create_qp(struct mk_qpair *qp)
{
	struct ibv_qp_init_attr_ex attr;
	struct mlx5dv_qp_init_attr dv;

	if (ibv_query_device_ex(qp->ctx, NULL, &qp->dattr))
		return -errno;
	if (qp->dattr.orig_attr.max_qp_wr < MK_RECV_DEPTH)
		return -ENOSPC;

	memset(&attr, 0, sizeof(attr));
	memset(&dv, 0, sizeof(dv));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = qp->cq;
	attr.recv_cq = qp->cq;
	attr.pd = qp->pd;
	/* BUG(file): rdma-send-queue-undersized -- a command keeps UMR, SEND and LOCAL_INV on the queue: 3 per command */
	attr.cap.max_send_wr = 2 * qp->depth;
	attr.cap.max_recv_wr = MK_RECV_DEPTH;	// OK: rdma-queue-cap-unchecked -- compared with dattr.orig_attr.max_qp_wr above
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 0;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;

	qp->qp = mlx5dv_create_qp(qp->ctx, &attr, &dv);
	if (!qp->qp)
		return -errno;
	qp->qpx = ibv_qp_to_qp_ex(qp->qp);
	qp->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(qp->qpx);
	return 0;
}

static int mk_qpair_create_mkeys(struct mk_qpair *qp)
{
	struct mlx5dv_mkey_init_attr mattr = {
		.pd = qp->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = MK_MAX_SGE,
	};
	uint32_t i, j;

	qp->reqs = calloc(qp->depth, sizeof(*qp->reqs));
	if (!qp->reqs)
		return -ENOMEM;
	for (i = 0; i < qp->depth; i++) {
		qp->reqs[i].qp = qp;
		qp->reqs[i].mkey = mlx5dv_create_mkey(&mattr);
		if (!qp->reqs[i].mkey)
			goto err;
		qp->reqs[i].next_free = qp->free_reqs;
		qp->free_reqs = &qp->reqs[i];
	}
	return 0;
err:
	for (j = 0; j < i; j++)
		mlx5dv_destroy_mkey(qp->reqs[j].mkey);
	free(qp->reqs);
	qp->reqs = NULL;
	return -ENOMEM;
}

static int mk_post_cmd_recv(struct mk_qpair *qp, uint32_t idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&qp->cmd_ring[idx],
		.length = sizeof(struct mk_cmd),
		.lkey = qp->cmd_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = idx, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp->qp, &wr, &bad);
}

static void mk_req_unmap_ext(struct mk_req *req)
{
	uint16_t i;

	for (i = 0; i < req->n_ext; i++)
		ibv_dereg_mr(req->ext_mr[i]);	// BUG: rdma-registration-in-datapath -- external buffers are deregistered at every command's completion
	req->n_ext = 0;
}

static int mk_req_map_ext(struct mk_qpair *qp, struct mk_req *req,
			  const struct iovec *iov, int iovcnt)
{
	int i, err;

	if (iovcnt > MK_MAX_SGE)
		return -EINVAL;
	req->n_ext = 0;
	for (i = 0; i < iovcnt; i++) {
		struct ibv_mr *mr;

		mr = ibv_reg_mr(qp->pd, iov[i].iov_base, iov[i].iov_len, IBV_ACCESS_LOCAL_WRITE);	// BUG: rdma-registration-in-datapath -- each backend iovec is registered per command
		if (!mr) {
			err = errno;
			mk_req_unmap_ext(req);
			return -err;	// OK: rdma-mr-leak -- earlier MRs are in req->ext_mr and released above; this one failed
		}
		req->ext_mr[req->n_ext++] = mr;
		req->sgl[i].addr = (uintptr_t)iov[i].iov_base;
		req->sgl[i].length = iov[i].iov_len;
		req->sgl[i].lkey = mr->lkey;
	}
	req->nsge = iovcnt;
	return 0;
}

static int mk_req_map_pool(struct mk_qpair *qp, struct mk_req *req, uint32_t len)
{
	uint16_t n = (len + MK_BUF_SIZE - 1) / MK_BUF_SIZE, i;

	if (n == 0 || n > MK_MAX_SGE || n > qp->nfree)
		return -EAGAIN;
	for (i = 0; i < n; i++) {
		uint32_t b = qp->buf_stack[--qp->nfree];

		req->bufs[i] = b;
		req->sgl[i].addr = (uintptr_t)(qp->data_pool + (size_t)b * MK_BUF_SIZE);
		req->sgl[i].length = MK_BUF_SIZE;
		req->sgl[i].lkey = qp->data_mr->lkey;
	}
	req->nsge = n;
	return 0;
}

static void mk_build_umr(struct mk_qpair *qp, struct mk_req *req, bool host_write)
{
	uint32_t access = IBV_ACCESS_REMOTE_READ;

	if (host_write)
		access |= IBV_ACCESS_REMOTE_WRITE;

	qp->qpx->wr_id = (uintptr_t)req;
	qp->qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(qp->mqpx, req->mkey, access, req->nsge, req->sgl);	// BUG: rdma-access-flags-invalid -- host-write commands get REMOTE_WRITE without LOCAL_WRITE
}

static unsigned int mk_rsp_flags(struct mk_qpair *qp)
{
	if (++qp->since_signal >= MK_SIGNAL_EVERY) {
		qp->since_signal = 0;
		return IBV_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- since_signal advances with every response
	}
	return 0;
}

static int mk_req_exec(struct mk_qpair *qp, struct mk_req *req, const struct mk_cmd *cmd,
		       const struct iovec *ext, int ext_cnt)
{
	struct mk_rsp *rsp = &qp->rsp_ring[req - qp->reqs];
	int rc;

	req->cid = cmd->cid;
	rc = ext_cnt ? mk_req_map_ext(qp, req, ext, ext_cnt) : mk_req_map_pool(qp, req, cmd->len);
	if (rc)
		return rc;

	rsp->cid = req->cid;
	rsp->status = 0;
	rsp->rkey = req->mkey->rkey;
	rsp->addr = req->sgl[0].addr;
	rsp->tag = (uint32_t)(req - qp->reqs);
	rsp->len = cmd->len;

	ibv_wr_start(qp->qpx);
	mk_build_umr(qp, req, cmd->flags & MK_CMD_HOST_WRITE);
	qp->qpx->wr_id = (uintptr_t)req;
	qp->qpx->wr_flags = mk_rsp_flags(qp);
	ibv_wr_send(qp->qpx);
	ibv_wr_set_sge(qp->qpx, qp->meta_mr->lkey, (uintptr_t)rsp, sizeof(*rsp));
	return ibv_wr_complete(qp->qpx);
}

static int mk_req_release(struct mk_qpair *qp, struct mk_req *req)
{
	ibv_wr_start(qp->qpx);
	qp->qpx->wr_id = (uintptr_t)req | MK_WRID_INV;
	qp->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qp->qpx, req->mkey->rkey);
	return ibv_wr_complete(qp->qpx);
}

static void mk_req_done(struct mk_qpair *qp, struct mk_req *req)
{
	uint16_t i;

	if (req->n_ext)
		mk_req_unmap_ext(req);
	else
		for (i = 0; i < req->nsge; i++)
			qp->buf_stack[qp->nfree++] = req->bufs[i];
	req->nsge = 0;
	req->next_free = qp->free_reqs;
	qp->free_reqs = req;
}

/* error responses carry sense data from a buffer registered on first use */
static int mk_send_error(struct mk_qpair *qp, uint16_t cid, uint16_t status)
{
	struct mk_rsp *rsp = (struct mk_rsp *)qp->sense;

	if (!qp->sense_mr) {
		qp->sense = calloc(1, MK_SENSE_SIZE);
		if (!qp->sense)
			return -ENOMEM;
		qp->sense_mr = ibv_reg_mr(qp->pd, qp->sense, MK_SENSE_SIZE, IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-registration-in-datapath -- first error only, kept in the qpair
		if (!qp->sense_mr) {
			free(qp->sense);
			qp->sense = NULL;
			return -ENOMEM;
		}
		rsp = (struct mk_rsp *)qp->sense;
	}
	rsp->cid = cid;
	rsp->status = status;
	ibv_wr_start(qp->qpx);
	qp->qpx->wr_id = 0;
	qp->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qp->qpx);
	ibv_wr_set_sge(qp->qpx, qp->sense_mr->lkey, (uintptr_t)qp->sense, sizeof(*rsp));
	return ibv_wr_complete(qp->qpx);
}

int mk_qpair_poll(struct mk_qpair *qp, const struct iovec *(*backend_iov)(uint16_t cid, int *cnt))
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(qp->cq, 32, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		if (wc[i].opcode & IBV_WC_RECV) {
			struct mk_cmd *cmd = &qp->cmd_ring[wc[i].wr_id];
			struct mk_req *req;
			const struct iovec *iov;
			int cnt = 0;

			if (cmd->flags & MK_CMD_RELEASE) {
				if (cmd->cid < qp->depth)
					mk_req_release(qp, &qp->reqs[cmd->cid]);
			} else if ((req = qp->free_reqs) != NULL) {
				qp->free_reqs = req->next_free;
				iov = backend_iov ? backend_iov(cmd->cid, &cnt) : NULL;
				if (mk_req_exec(qp, req, cmd, iov, iov ? cnt : 0)) {
					mk_req_done(qp, req);
					mk_send_error(qp, cmd->cid, 0x6);
				}
			} else {
				mk_send_error(qp, cmd->cid, 0x22);
			}
			mk_post_cmd_recv(qp, (uint32_t)wc[i].wr_id);
		} else if (wc[i].wr_id & MK_WRID_INV) {
			mk_req_done(qp, (struct mk_req *)(uintptr_t)(wc[i].wr_id & ~MK_WRID_INV));
		}
	}
	return n;
}

void mk_qpair_destroy(struct mk_qpair *qp)
{
	uint32_t i;

	if (qp->qp)
		ibv_destroy_qp(qp->qp);
	for (i = 0; qp->reqs && i < qp->depth; i++) {
		mk_req_unmap_ext(&qp->reqs[i]);
		mlx5dv_destroy_mkey(qp->reqs[i].mkey);
	}
	if (qp->sense_mr)
		ibv_dereg_mr(qp->sense_mr);
	if (qp->cmd_mr)
		ibv_dereg_mr(qp->cmd_mr);
	if (qp->data_mr)
		ibv_dereg_mr(qp->data_mr);
	free(qp->sense);
	free(qp->reqs);
	free(qp->rsp_ring);
	free(qp->cmd_ring);
	free(qp->data_pool);
	free(qp);
}

struct mk_qpair *mk_qpair_create(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t depth)
{
	struct mk_qpair *qp = calloc(1, sizeof(*qp));
	uint32_t i;

	if (!qp)
		return NULL;
	qp->ctx = pd->context;
	qp->pd = pd;
	qp->cq = cq;
	qp->depth = depth;
	if (mk_qpair_alloc_bufs(qp)) {
		free(qp);
		return NULL;
	}
	if (mk_qpair_create_qp(qp) || mk_qpair_create_mkeys(qp))
		goto err;
	for (i = 0; i < MK_RECV_DEPTH; i++)
		if (mk_post_cmd_recv(qp, i))
			goto err;
	return qp;
err:
	mk_qpair_destroy(qp);	// BUG: rdma-mr-leak -- after a later setup step fails, qp->meta_mr is still registered and mk_qpair_destroy() frees the qpair without deregistering it
	return NULL;
}
