/*
 * tgt_qpair.c - queue pairs of the NVMe-oF RDMA target and the data
 * buffer pool they share.
 *
 * The data pool is registered once at startup; I/O buffers are carved
 * from it and only ever addressed by the target's own RDMA READs and
 * WRITEs.  Each queue pair gets command, completion and in-capsule data
 * buffers, one of each per slot, and a receive posted for every slot.
 * The send queue holds the data work requests and the completion SEND of
 * every outstanding request (SEND, READ and WRITE).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_verbs.h>
#include "tgt_rdma.h"

#define TGT_MIN(a, b) ((a) < (b) ? (a) : (b))

static struct {
	char            *base;
	size_t           len;
	struct ibv_mr   *mr;
	void           **free;
	unsigned int     nfree;
} g_data_pool;

int tgt_data_pool_init(struct ibv_pd *pd, size_t len)
{
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	unsigned int i, n = len / TGT_IO_UNIT_SIZE;

	/* iWARP requires REMOTE_WRITE on the sink of an RDMA READ */
	if (pd->context->device->transport_type == IBV_TRANSPORT_IWARP)
		access |= IBV_ACCESS_REMOTE_WRITE;

	g_data_pool.base = aligned_alloc(2 * 1024 * 1024, len);
	g_data_pool.free = calloc(n, sizeof(void *));
	if (!g_data_pool.base || !g_data_pool.free)
		return -ENOMEM;
	// BUG: rdma-local-mr-management, rdma-access-flags-transport, rdma-remote-access-overbroad -- the target's own RDMA buffers, rights chosen by an inline iWARP test, and REMOTE_READ although no key ever leaves
	g_data_pool.mr = ibv_reg_mr(pd, g_data_pool.base, len, access);
	if (!g_data_pool.mr)
		return -errno;
	g_data_pool.len = len;
	for (i = 0; i < n; i++)
		g_data_pool.free[g_data_pool.nfree++] = g_data_pool.base + (size_t)i * TGT_IO_UNIT_SIZE;
	return 0;
}

void tgt_data_pool_fini(void)
{
	if (g_data_pool.mr)
		ibv_dereg_mr(g_data_pool.mr);
	g_data_pool.mr = NULL;
	free(g_data_pool.free);
	free(g_data_pool.base);	/* OK: rdma-invalidation-leak -- the pool is freed after its registration is gone */
}

uint32_t tgt_data_lkey(void)
{
	return g_data_pool.mr->lkey;
}

void *tgt_data_buf_get(void)
{
	return g_data_pool.nfree ? g_data_pool.free[--g_data_pool.nfree] : NULL;
}

void tgt_data_buf_put(void *buf)
{
	g_data_pool.free[g_data_pool.nfree++] = buf;
}

int tgt_qpair_create(struct tgt_rdma_qpair *rq, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr qp_init_attr;
	struct ibv_device_attr dev_attr;

	if (ibv_query_device(rq->cm_id->verbs, &dev_attr))
		return -errno;

	memset(&qp_init_attr, 0, sizeof(qp_init_attr));
	qp_init_attr.qp_type = IBV_QPT_RC;
	qp_init_attr.send_cq = cq;
	qp_init_attr.recv_cq = cq;
	qp_init_attr.sq_sig_all = 0;	/* OK: rdma-unsignaled-send-starvation -- the last READ and every completion SEND are signaled */
	// BUG(program): rdma-send-queue-undersized -- a host read posts up to four WRITEs and the completion SEND, two entries per request are reserved
	qp_init_attr.cap.max_send_wr = (uint32_t)rq->max_queue_depth * 2;	/* OK: rdma-send-queue-manual-factor -- the factor covers data work requests; nothing here registers or invalidates */
	qp_init_attr.cap.max_recv_wr = rq->max_queue_depth;
	/* OK: rdma-queue-cap-unchecked -- the gather list is clamped to the device's max_sge */
	qp_init_attr.cap.max_send_sge = TGT_MIN((uint32_t)dev_attr.max_sge, TGT_DEFAULT_TX_SGE);
	qp_init_attr.cap.max_recv_sge = 2;	/* command + in-capsule data */

	if (rdma_create_qp(rq->cm_id, rq->pd, &qp_init_attr))
		return -errno;
	rq->qp = rq->cm_id->qp;
	return 0;
}

int tgt_qpair_alloc_resources(struct tgt_rdma_qpair *rq)
{
	struct tgt_resources *res;
	unsigned int i, depth = rq->max_queue_depth;

	res = calloc(1, sizeof(*res));
	rq->reqs = calloc(depth, sizeof(*rq->reqs));
	if (!res || !rq->reqs)
		goto err_free;
	res->cmds = calloc(depth, sizeof(*res->cmds));
	res->cpls = calloc(depth, sizeof(*res->cpls));
	res->bufs = aligned_alloc(4096, (size_t)depth * TGT_IN_CAPSULE_SIZE);
	if (!res->cmds || !res->cpls || !res->bufs)
		goto err_free;

	/* OK: rdma-local-mr-management, rdma-registration-in-datapath -- command capsules are only received; queue setup posts nothing but receives */
	res->cmds_mr = rdma_reg_msgs(rq->cm_id, res->cmds, depth * sizeof(*res->cmds));
	if (!res->cmds_mr)
		goto err_free;
	/* OK: rdma-local-mr-management -- completions are only sent */
	res->cpls_mr = ibv_reg_mr(rq->pd, res->cpls, depth * sizeof(*res->cpls), 0);
	if (!res->cpls_mr)
		goto err_cmds_mr;
	// BUG: rdma-local-mr-management -- in-capsule buffers are also the sink of the target's RDMA READ for small writes
	res->bufs_mr = rdma_reg_msgs(rq->cm_id, res->bufs, (size_t)depth * TGT_IN_CAPSULE_SIZE);
	if (!res->bufs_mr)
		goto err_cpls_mr;

	for (i = 0; i < depth; i++) {
		struct tgt_request *req = &rq->reqs[i];
		struct ibv_recv_wr *bad;
		struct ibv_sge sgl[2] = {
			{ (uintptr_t)&res->cmds[i], sizeof(res->cmds[i]), res->cmds_mr->lkey },
			{ (uintptr_t)(res->bufs + (size_t)i * TGT_IN_CAPSULE_SIZE), TGT_IN_CAPSULE_SIZE, res->bufs_mr->lkey },
		};

		req->qpair = rq;
		req->slot = i;
		req->cmd = &res->cmds[i];
		req->cpl = &res->cpls[i];
		req->recv_wr.wr_id = (uintptr_t)req;
		req->recv_wr.sg_list = sgl;
		req->recv_wr.num_sge = 2;
		if (ibv_post_recv(rq->qp, &req->recv_wr, &bad))
			goto err_bufs_mr;
	}
	rq->res = res;
	return 0;

err_bufs_mr:
	/* OK: rdma-mr-leak -- every registration made above is undone in order */
	ibv_dereg_mr(res->bufs_mr);
err_cpls_mr:
	ibv_dereg_mr(res->cpls_mr);
err_cmds_mr:
	ibv_dereg_mr(res->cmds_mr);
err_free:
	if (res) {
		free(res->cmds);
		free(res->cpls);
		free(res->bufs);
	}
	free(res);
	free(rq->reqs);
	return -ENOMEM;
}

void tgt_qpair_destroy(struct tgt_rdma_qpair *rq)
{
	struct tgt_resources *res = rq->res;

	rdma_destroy_qp(rq->cm_id);
	ibv_dereg_mr(res->cmds_mr);
	ibv_dereg_mr(res->cpls_mr);
	free(res->cmds);
	free(res->cpls);
	free(res->bufs);	/* OK: rdma-invalidation-leak -- in-capsule buffers carry no remote rights */
	free(res);		// BUG: rdma-mr-leak -- res->bufs_mr is never deregistered; its holder is freed here
	free(rq->reqs);
	rq->res = NULL;
}
