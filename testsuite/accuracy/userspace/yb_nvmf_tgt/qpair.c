/*
 * qpair.c - per-connection resources of the yb NVMe-oF RDMA target.
 *
 * A qpair owns its command ring (RECV sink), completion ring (SEND
 * source) and in-capsule data buffers, all registered for local access
 * only at connect time.  nvmf_rdma_qpair_destroy_resources() releases
 * whatever was set up; it is the unwinding of the allocation and the
 * teardown of a live qpair.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "nvmf_rdma.h"

void
nvmf_rdma_qpair_destroy_resources(struct nvmf_rdma_qpair *rqpair)
{
	if (rqpair->bufs_mr) {
		ibv_dereg_mr(rqpair->bufs_mr);
		rqpair->bufs_mr = NULL;
	}
	if (rqpair->cpls_mr) {
		ibv_dereg_mr(rqpair->cpls_mr);
		rqpair->cpls_mr = NULL;
	}
	if (rqpair->cmds_mr) {
		ibv_dereg_mr(rqpair->cmds_mr);
		rqpair->cmds_mr = NULL;
	}
	free(rqpair->reqs);
	free(rqpair->bufs);
	free(rqpair->cpls);
	free(rqpair->cmds);
	rqpair->reqs = NULL;
	rqpair->bufs = NULL;
	rqpair->cpls = NULL;
	rqpair->cmds = NULL;
}

static int
nvmf_rdma_qpair_post_recvs(struct nvmf_rdma_qpair *rqpair)
{
	struct ibv_recv_wr *bad_wr = NULL;
	struct nvmf_rdma_request *req;
	uint16_t i;

	for (i = 0; i < rqpair->max_queue_depth; i++) {
		req = &rqpair->reqs[i];
		req->recv_sge.addr = (uintptr_t)&rqpair->cmds[i];
		req->recv_sge.length = sizeof(struct nvme_cmd);
		req->recv_sge.lkey = rqpair->cmds_mr->lkey;
		req->recv_wr.wr_id = (uintptr_t)req;
		req->recv_wr.sg_list = &req->recv_sge;
		req->recv_wr.num_sge = 1;
		req->recv_wr.next = (i + 1 < rqpair->max_queue_depth) ?
				    &rqpair->reqs[i + 1].recv_wr : NULL;
	}
	return ibv_post_recv(rqpair->qp, &rqpair->reqs[0].recv_wr, &bad_wr);
}

static int
nvmf_rdma_qpair_alloc_resources(struct nvmf_rdma_qpair *rqpair)
{
	struct nvmf_rdma_device *device = rqpair->pg->device;
	uint16_t depth = rqpair->max_queue_depth;
	struct nvmf_rdma_request *req;
	uint16_t i;

	rqpair->cmds = calloc(depth, sizeof(*rqpair->cmds));
	if (!rqpair->cmds)
		goto err;
	// OK: rdma-registration-in-datapath -- connect-time registration; the function only posts the receive ring
	rqpair->cmds_mr = ibv_reg_mr(device->pd, rqpair->cmds,
				     depth * sizeof(*rqpair->cmds),
				     IBV_ACCESS_LOCAL_WRITE);
	if (!rqpair->cmds_mr) {
		NVMF_ERRLOG("unable to register command ring\n");
		goto err;
	}

	if (device->attr.max_sge < NVMF_RDMA_DEFAULT_RX_SGE) {
		NVMF_ERRLOG("device supports only %d SGEs\n", device->attr.max_sge);
		return -EINVAL; // BUG: rdma-mr-leak -- returns without the unwinding; cmds_mr stays in the qpair that the caller frees
	}

	rqpair->cpls = calloc(depth, sizeof(*rqpair->cpls));
	if (!rqpair->cpls)
		goto err;
	// OK: rdma-access-flags-invalid -- a SEND source needs no rights at all
	rqpair->cpls_mr = ibv_reg_mr(device->pd, rqpair->cpls,
				     depth * sizeof(*rqpair->cpls), 0);
	if (!rqpair->cpls_mr)
		goto err;

	rqpair->bufs = aligned_alloc(4096, (size_t)depth * NVMF_IN_CAPSULE_DATA_SIZE);
	if (!rqpair->bufs)
		goto err;
	rqpair->bufs_mr = ibv_reg_mr(device->pd, rqpair->bufs,
				     (size_t)depth * NVMF_IN_CAPSULE_DATA_SIZE,
				     IBV_ACCESS_LOCAL_WRITE);
	if (!rqpair->bufs_mr)
		goto err;

	rqpair->reqs = calloc(depth, sizeof(*rqpair->reqs));
	if (!rqpair->reqs)
		goto err; // OK: rdma-mr-leak -- the error label releases every ring through destroy_resources

	STAILQ_INIT(&rqpair->free_reqs);
	for (i = 0; i < depth; i++) {
		req = &rqpair->reqs[i];
		req->rqpair = rqpair;
		req->cmd = &rqpair->cmds[i];
		req->cpl = &rqpair->cpls[i];
		req->state = RDMA_REQ_STATE_FREE;
		req->rsp_sge.addr = (uintptr_t)req->cpl;
		req->rsp_sge.length = sizeof(*req->cpl);
		req->rsp_sge.lkey = rqpair->cpls_mr->lkey;
		req->rsp_wr.wr_id = (uintptr_t)req;
		req->rsp_wr.opcode = IBV_WR_SEND;
		req->rsp_wr.send_flags = IBV_SEND_SIGNALED;
		req->rsp_wr.sg_list = &req->rsp_sge;
		req->rsp_wr.num_sge = 1;
		STAILQ_INSERT_TAIL(&rqpair->free_reqs, req, link);
	}

	if (nvmf_rdma_qpair_post_recvs(rqpair)) {
		NVMF_ERRLOG("unable to post the receive ring\n");
		goto err;
	}
	return 0;

err:
	nvmf_rdma_qpair_destroy_resources(rqpair);
	return -ENOMEM;
}

struct nvmf_rdma_qpair *
nvmf_rdma_qpair_create(struct nvmf_rdma_poll_group *pg, struct rdma_cm_id *id,
		       uint16_t depth)
{
	struct nvmf_rdma_qpair *rqpair;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;

	rqpair = calloc(1, sizeof(*rqpair));
	if (!rqpair)
		return NULL;
	rqpair->cm_id = id;
	rqpair->pg = pg;
	rqpair->max_queue_depth = depth;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = pg->cq;
	attr.recv_cq = pg->cq;
	attr.cap.max_send_wr = (uint32_t)depth * 2;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, pg->device->pd, &attr)) {
		NVMF_ERRLOG("rdma_create_qp failed: %s\n", strerror(errno));
		free(rqpair);
		return NULL;
	}
	rqpair->qp = id->qp;

	if (nvmf_rdma_qpair_alloc_resources(rqpair)) {
		rdma_destroy_qp(id);
		free(rqpair);
		return NULL;
	}

	memset(&param, 0, sizeof(param));
	param.responder_resources = 1;
	param.initiator_depth = 16;
	param.rnr_retry_count = 7;
	if (rdma_accept(id, &param)) {
		NVMF_ERRLOG("rdma_accept failed: %s\n", strerror(errno));
		nvmf_rdma_qpair_destroy(rqpair); // OK: rdma-mr-leak -- the destroy path releases every ring MR
		return NULL;
	}

	id->context = rqpair;
	TAILQ_INSERT_TAIL(&pg->qpairs, rqpair, link);
	return rqpair;
}

void
nvmf_rdma_qpair_destroy(struct nvmf_rdma_qpair *rqpair)
{
	uint16_t i;

	if (rqpair->reqs) {
		for (i = 0; i < rqpair->max_queue_depth; i++) {
			struct nvmf_rdma_request *req = &rqpair->reqs[i];

			if (req->adhoc_mr) {
				ibv_dereg_mr(req->adhoc_mr);
				req->adhoc_mr = NULL;
			}
		}
	}
	if (rqpair->cm_id && rqpair->cm_id->qp)
		rdma_destroy_qp(rqpair->cm_id);
	nvmf_rdma_qpair_destroy_resources(rqpair);
	free(rqpair);
}
