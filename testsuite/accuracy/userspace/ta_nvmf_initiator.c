/*   SPDX-License-Identifier: BSD-3-Clause
 *
 *   ta_nvmf_initiator.c - NVMe-oF RDMA initiator qpair with per-request
 *   memory windows.
 *
 *   The payload pool is registered once (LOCAL_WRITE | MW_BIND); every I/O
 *   binds the request's type 2 window over its payload and puts the window's
 *   rkey in a keyed SGL with the "invalidate" sub-type, so the target answers
 *   with SEND_WITH_INV.  A response without remote invalidation is followed
 *   by a signaled LOCAL_INV, and the request is completed from its work
 *   completion.  Unaligned payloads go through a per-request bounce buffer.
 *   Responses arrive either on the qpair's own receive queue or, in poll
 *   group mode, on a shared receive queue.
 *
 *   NOT-ANNOTATED: rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not covered by this file
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/queue.h>
#include <infiniband/verbs.h>

#ifndef TAILQ_FOREACH_SAFE
#define TAILQ_FOREACH_SAFE(var, head, field, tvar)			\
	for ((var) = TAILQ_FIRST((head));				\
	     (var) && ((tvar) = TAILQ_NEXT((var), field), 1);		\
	     (var) = (tvar))
#endif

#define SPDK_ERRLOG(...)	fprintf(stderr, "nvme_rdma: " __VA_ARGS__)
#define SPDK_WARNLOG(...)	fprintf(stderr, "nvme_rdma: " __VA_ARGS__)
#define spdk_unlikely(cond)	__builtin_expect(!!(cond), 0)
#define SPDK_CONTAINEROF(ptr, type, member) \
	((type *)((uintptr_t)(ptr) - offsetof(type, member)))

#define NVME_RDMA_POLL_BATCH		32
#define NVME_RDMA_PAYLOAD_ALIGN		4
#define NVME_RDMA_BOUNCE_SIZE		(128 * 1024)
#define SPDK_NVME_SC_ABORTED_BY_REQUEST	0x07
#define SPDK_NVME_SC_ABORTED_SQ_DELETION 0x08

enum nvme_rdma_wr_type {
	RDMA_WR_TYPE_RECV,
	RDMA_WR_TYPE_SEND,
	RDMA_WR_TYPE_BIND,
	RDMA_WR_TYPE_INV,
};

struct nvme_rdma_wr {
	uint8_t type;
};

enum {
	NVME_RDMA_SEND_COMPLETED = 1u << 0,
	NVME_RDMA_RECV_COMPLETED = 1u << 1,
};

struct spdk_nvme_cpl {
	uint32_t cdw0;
	uint32_t rsvd1;
	uint16_t sqhd;
	uint16_t sqid;
	uint16_t cid;
	uint16_t status;
};

struct spdk_nvme_cmd {
	uint8_t  opc;
	uint8_t  flags;
	uint16_t cid;
	uint32_t nsid;
	uint64_t rsvd[2];
	struct {
		uint64_t address;
		uint8_t  length[3];
		uint8_t  key[4];
		uint8_t  subtype_type;
	} __attribute__((packed)) keyed_sgl;
	uint32_t cdw10_15[6];
};

typedef void (*spdk_nvme_cmd_cb)(void *arg, const struct spdk_nvme_cpl *cpl);

struct spdk_nvme_rdma_req {
	uint16_t			id;
	uint16_t			completion_flags;
	bool				bound;
	struct ibv_mw			*mw;
	uint32_t			rkey;
	void				*bounce;	/* slice of the payload pool */
	struct spdk_nvme_cmd		cmd;
	struct spdk_nvme_cpl		cpl;
	struct nvme_rdma_wr		rdma_wr;
	struct nvme_rdma_wr		bind_rdma_wr;
	struct nvme_rdma_wr		inv_rdma_wr;
	struct ibv_send_wr		bind_wr;
	struct ibv_send_wr		send_wr;
	struct ibv_send_wr		inv_wr;
	struct ibv_sge			send_sgl;
	spdk_nvme_cmd_cb		cb_fn;
	void				*cb_arg;
	uint64_t			timeout_tsc;
	TAILQ_ENTRY(spdk_nvme_rdma_req)	link;
};

struct nvme_rdma_qpair {
	struct ibv_qp				*qp;
	struct ibv_cq				*cq;
	struct ibv_mr				*cmd_mr;
	struct ibv_mr				*rsp_mr;
	struct ibv_mr				*payload_mr;
	uint16_t				num_entries;
	bool					failed;
	struct spdk_nvme_cpl			*rsps;
	struct spdk_nvme_rdma_req		*rdma_reqs;
	TAILQ_HEAD(, spdk_nvme_rdma_req)	free_reqs;
	TAILQ_HEAD(, spdk_nvme_rdma_req)	outstanding_reqs;
};

static void nvme_rdma_fail_qpair(struct nvme_rdma_qpair *rqpair)
{
	rqpair->failed = true;
}

static struct spdk_nvme_rdma_req *nvme_rdma_req_get(struct nvme_rdma_qpair *rqpair)
{
	struct spdk_nvme_rdma_req *rdma_req = TAILQ_FIRST(&rqpair->free_reqs);

	if (rdma_req == NULL)
		return NULL;
	TAILQ_REMOVE(&rqpair->free_reqs, rdma_req, link);
	TAILQ_INSERT_TAIL(&rqpair->outstanding_reqs, rdma_req, link);
	rdma_req->completion_flags = 0;
	return rdma_req;
}

static void nvme_rdma_req_complete(struct nvme_rdma_qpair *rqpair,
				   struct spdk_nvme_rdma_req *rdma_req)
{
	TAILQ_REMOVE(&rqpair->outstanding_reqs, rdma_req, link);
	rdma_req->cb_fn(rdma_req->cb_arg, &rdma_req->cpl);
	TAILQ_INSERT_HEAD(&rqpair->free_reqs, rdma_req, link);
}

/* complete once the command was sent, the response arrived and the window is dead */
static void nvme_rdma_try_complete(struct nvme_rdma_qpair *rqpair,
				   struct spdk_nvme_rdma_req *rdma_req)
{
	if (rdma_req->completion_flags != (NVME_RDMA_SEND_COMPLETED | NVME_RDMA_RECV_COMPLETED))
		return;
	if (rdma_req->bound)
		return;
	nvme_rdma_req_complete(rqpair, rdma_req);
}

static int nvme_rdma_post_local_inv(struct nvme_rdma_qpair *rqpair,
				    struct spdk_nvme_rdma_req *rdma_req)
{
	struct ibv_send_wr *bad_wr;

	rdma_req->inv_wr.opcode = IBV_WR_LOCAL_INV;
	rdma_req->inv_wr.send_flags = IBV_SEND_SIGNALED;
	rdma_req->inv_wr.invalidate_rkey = rdma_req->rkey;
	rdma_req->inv_wr.next = NULL;
	return ibv_post_send(rqpair->qp, &rdma_req->inv_wr, &bad_wr);
}

static void nvme_rdma_req_bind_payload(struct nvme_rdma_qpair *rqpair,
				       struct spdk_nvme_rdma_req *rdma_req,
				       void *payload, uint32_t len, int access)
{
	struct ibv_send_wr *wr = &rdma_req->bind_wr;

	rdma_req->rkey = ibv_inc_rkey(rdma_req->rkey);

	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)&rdma_req->bind_rdma_wr;
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = rdma_req->mw;
	wr->bind_mw.rkey = rdma_req->rkey; /* OK: rdma-rkey-reuse -- rotated with ibv_inc_rkey() just above */
	wr->bind_mw.bind_info.mr = rqpair->payload_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)payload;
	wr->bind_mw.bind_info.length = len;
	wr->bind_mw.bind_info.mw_access_flags = access;
	wr->next = &rdma_req->send_wr;
}

static void nvme_rdma_req_bind_bounce(struct nvme_rdma_qpair *rqpair,
				      struct spdk_nvme_rdma_req *rdma_req,
				      const void *payload, uint32_t len, int access)
{
	struct ibv_send_wr *wr = &rdma_req->bind_wr;

	if (access == IBV_ACCESS_REMOTE_READ)
		memcpy(rdma_req->bounce, payload, len);

	rdma_req->rkey = rdma_req->mw->rkey;
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)&rdma_req->bind_rdma_wr;
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = rdma_req->mw;
	wr->bind_mw.rkey = rdma_req->rkey; /* BUG: rdma-rkey-reuse -- every bounce I/O binds the window under its allocation key again */
	wr->bind_mw.bind_info.mr = rqpair->payload_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)rdma_req->bounce;
	wr->bind_mw.bind_info.length = len;
	wr->bind_mw.bind_info.mw_access_flags = access;
	wr->next = &rdma_req->send_wr;
}

int nvme_rdma_qpair_submit_request(struct nvme_rdma_qpair *rqpair,
				   const struct spdk_nvme_cmd *cmd, void *payload,
				   uint32_t len, bool host_to_ctrlr,
				   spdk_nvme_cmd_cb cb_fn, void *cb_arg, uint64_t timeout_tsc)
{
	struct spdk_nvme_rdma_req *rdma_req;
	struct ibv_send_wr *first, *bad_wr = NULL;
	int access = host_to_ctrlr ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	int rc;

	if (rqpair->failed)
		return -ENXIO;
	rdma_req = nvme_rdma_req_get(rqpair);
	if (rdma_req == NULL)
		return -EAGAIN;

	rdma_req->cmd = *cmd;
	rdma_req->cmd.cid = rdma_req->id;
	rdma_req->cb_fn = cb_fn;
	rdma_req->cb_arg = cb_arg;
	rdma_req->timeout_tsc = timeout_tsc;
	rdma_req->bound = false;

	first = &rdma_req->send_wr;
	if (len != 0) {
		if (((uintptr_t)payload & (NVME_RDMA_PAYLOAD_ALIGN - 1)) == 0)
			nvme_rdma_req_bind_payload(rqpair, rdma_req, payload, len, access);
		else
			nvme_rdma_req_bind_bounce(rqpair, rdma_req, payload, len, access);
		rdma_req->cmd.keyed_sgl.address = rdma_req->bind_wr.bind_mw.bind_info.addr;
		memcpy(rdma_req->cmd.keyed_sgl.length, &len, 3);
		memcpy(rdma_req->cmd.keyed_sgl.key, &rdma_req->rkey, 4);
		rdma_req->cmd.keyed_sgl.subtype_type = 0x4f;	/* keyed data block, invalidate key */
		first = &rdma_req->bind_wr;
	}

	rc = ibv_post_send(rqpair->qp, first, &bad_wr);
	if (spdk_unlikely(rc)) {
		SPDK_ERRLOG("failed to post cid %u: %d\n", rdma_req->id, rc);
		if (bad_wr != first) {
			/* the bind went out, only the command did not */
			rdma_req->bound = true;
			nvme_rdma_fail_qpair(rqpair);
			return -EIO;
		}
		TAILQ_REMOVE(&rqpair->outstanding_reqs, rdma_req, link);
		TAILQ_INSERT_HEAD(&rqpair->free_reqs, rdma_req, link); /* OK: rdma-invalidation-leak -- the first WR failed, nothing was bound */
		return -EIO;
	}
	rdma_req->bound = (len != 0);
	return 0;
}

/* responses on the qpair's own receive queue */
static void nvme_rdma_process_recv_completion(struct nvme_rdma_qpair *rqpair,
					      struct ibv_wc *wc)
{
	struct spdk_nvme_cpl *rsp = &rqpair->rsps[wc->wr_id];
	struct spdk_nvme_rdma_req *rdma_req;

	if (rsp->cid >= rqpair->num_entries) {
		nvme_rdma_fail_qpair(rqpair);
		return;
	}
	rdma_req = &rqpair->rdma_reqs[rsp->cid];
	rdma_req->cpl = *rsp;
	rdma_req->completion_flags |= NVME_RDMA_RECV_COMPLETED;

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (spdk_unlikely(wc->invalidated_rkey != rdma_req->rkey)) {
			SPDK_ERRLOG("Bad remotely invalidated rkey %#x, expected %#x\n",
				    wc->invalidated_rkey, rdma_req->rkey);
			nvme_rdma_fail_qpair(rqpair);
		}
		rdma_req->bound = false;
		nvme_rdma_try_complete(rqpair, rdma_req); /* BUG: rdma-remote-invalidate-unchecked, rdma-invalidation-leak -- on a mismatch the qpair is failed but the request is still completed with its own rkey live */
		return;
	}

	if (rdma_req->bound) {
		if (nvme_rdma_post_local_inv(rqpair, rdma_req))
			nvme_rdma_fail_qpair(rqpair);
		return;
	}
	nvme_rdma_try_complete(rqpair, rdma_req); /* OK: rdma-invalidation-leak -- a command without payload bound no window */
}

/* poll group mode: responses of every qpair land on one shared receive
 * queue; the poll group finds the qpair by wc->qp_num */
void nvme_rdma_process_srq_completion(struct nvme_rdma_qpair *rqpair,
					     struct spdk_nvme_cpl *rsp, struct ibv_wc *wc)
{
	struct spdk_nvme_rdma_req *rdma_req;

	if (rsp->cid >= rqpair->num_entries) {
		nvme_rdma_fail_qpair(rqpair);
		return;
	}
	rdma_req = &rqpair->rdma_reqs[rsp->cid];
	rdma_req->cpl = *rsp;
	rdma_req->completion_flags |= NVME_RDMA_RECV_COMPLETED;

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (spdk_unlikely(wc->invalidated_rkey != rdma_req->rkey)) {
			SPDK_ERRLOG("Bad remotely invalidated rkey %#x, expected %#x\n",
				    wc->invalidated_rkey, rdma_req->rkey);
			nvme_rdma_fail_qpair(rqpair);
			return;
		}
		rdma_req->bound = false;
		nvme_rdma_try_complete(rqpair, rdma_req); /* OK: rdma-remote-invalidate-unchecked, rdma-invalidation-leak -- the invalidated rkey is the request's, a mismatch returns */
		return;
	}

	if (rdma_req->bound && nvme_rdma_post_local_inv(rqpair, rdma_req))
		nvme_rdma_fail_qpair(rqpair);
	else if (!rdma_req->bound)
		nvme_rdma_try_complete(rqpair, rdma_req); /* OK: rdma-invalidation-leak -- only requests that bound no window complete here */
}

static void nvme_rdma_process_send_completion(struct nvme_rdma_qpair *rqpair,
					      struct ibv_wc *wc)
{
	struct nvme_rdma_wr *rdma_wr = (struct nvme_rdma_wr *)(uintptr_t)wc->wr_id;
	struct spdk_nvme_rdma_req *rdma_req;

	switch (rdma_wr->type) {
	case RDMA_WR_TYPE_SEND:
		rdma_req = SPDK_CONTAINEROF(rdma_wr, struct spdk_nvme_rdma_req, rdma_wr);
		if (spdk_unlikely(wc->status != IBV_WC_SUCCESS)) {
			nvme_rdma_fail_qpair(rqpair);
			return;
		}
		rdma_req->completion_flags |= NVME_RDMA_SEND_COMPLETED;
		nvme_rdma_try_complete(rqpair, rdma_req); /* OK: rdma-invalidation-leak -- try_complete waits until the window is no longer bound */
		break;
	case RDMA_WR_TYPE_INV:
		rdma_req = SPDK_CONTAINEROF(rdma_wr, struct spdk_nvme_rdma_req, inv_rdma_wr);
		if (spdk_unlikely(wc->status != IBV_WC_SUCCESS)) {
			SPDK_ERRLOG("LOCAL_INV for cid %u failed: %s\n", rdma_req->id,
				    ibv_wc_status_str(wc->status));
			/* the window stays bound until the qpair is torn down */
			nvme_rdma_fail_qpair(rqpair);
			return;
		}
		rdma_req->bound = false;
		nvme_rdma_try_complete(rqpair, rdma_req); /* OK: rdma-invalidation-leak -- LOCAL_INV completed successfully */
		break;
	default:
		if (wc->status != IBV_WC_SUCCESS)
			nvme_rdma_fail_qpair(rqpair);
		break;
	}
}

int nvme_rdma_qpair_process_completions(struct nvme_rdma_qpair *rqpair)
{
	struct ibv_wc wc[NVME_RDMA_POLL_BATCH];
	struct ibv_recv_wr recv_wr, *bad_recv;
	struct ibv_sge sge;
	int n, i;

	n = ibv_poll_cq(rqpair->cq, NVME_RDMA_POLL_BATCH, wc);
	if (n < 0)
		return -EIO;

	for (i = 0; i < n; i++) {
		if (!(wc[i].opcode & IBV_WC_RECV)) {
			nvme_rdma_process_send_completion(rqpair, &wc[i]);
			continue;
		}
		if (wc[i].status != IBV_WC_SUCCESS) {
			nvme_rdma_fail_qpair(rqpair);
			continue;
		}
		nvme_rdma_process_recv_completion(rqpair, &wc[i]);

		sge.addr = (uintptr_t)&rqpair->rsps[wc[i].wr_id];
		sge.length = sizeof(struct spdk_nvme_cpl);
		sge.lkey = rqpair->rsp_mr->lkey;
		recv_wr.wr_id = wc[i].wr_id;
		recv_wr.next = NULL;
		recv_wr.sg_list = &sge;
		recv_wr.num_sge = 1;
		if (ibv_post_recv(rqpair->qp, &recv_wr, &bad_recv))
			nvme_rdma_fail_qpair(rqpair);
	}
	return n;
}

void nvme_rdma_qpair_check_timeouts(struct nvme_rdma_qpair *rqpair, uint64_t now_tsc)
{
	struct spdk_nvme_rdma_req *rdma_req, *tmp;

	TAILQ_FOREACH_SAFE(rdma_req, &rqpair->outstanding_reqs, link, tmp) {
		if (rdma_req->timeout_tsc == 0 || rdma_req->timeout_tsc > now_tsc)
			continue;
		SPDK_WARNLOG("cid %u timed out, aborting\n", rdma_req->id);
		rdma_req->cpl.status = SPDK_NVME_SC_ABORTED_BY_REQUEST << 1;
		nvme_rdma_req_complete(rqpair, rdma_req); /* BUG: rdma-invalidation-leak -- the target still holds the window's rkey over the payload that goes back to the caller */
	}
}

void nvme_rdma_qpair_abort_request(struct nvme_rdma_qpair *rqpair, uint16_t cid)
{
	struct spdk_nvme_rdma_req *rdma_req = &rqpair->rdma_reqs[cid];
	struct ibv_send_wr *bad_wr;

	if (rdma_req->bound) {
		/* aborting: no need for a completion of the invalidation */
		rdma_req->inv_wr.opcode = IBV_WR_LOCAL_INV;
		rdma_req->inv_wr.send_flags = 0;
		rdma_req->inv_wr.invalidate_rkey = rdma_req->rkey;
		rdma_req->inv_wr.next = NULL;
		if (ibv_post_send(rqpair->qp, &rdma_req->inv_wr, &bad_wr)) {
			nvme_rdma_fail_qpair(rqpair);
			return;
		}
		rdma_req->bound = false;
	}
	rdma_req->cpl.status = SPDK_NVME_SC_ABORTED_BY_REQUEST << 1;
	nvme_rdma_req_complete(rqpair, rdma_req); /* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed when the payload is handed back */
}

/* called on disconnect, before the QP is destroyed */
int nvme_rdma_qpair_abort_reqs(struct nvme_rdma_qpair *rqpair)
{
	struct spdk_nvme_rdma_req *rdma_req, *tmp;
	struct ibv_wc wc[NVME_RDMA_POLL_BATCH];
	struct nvme_rdma_wr *rdma_wr;
	int pending = 0, n, i;

	TAILQ_FOREACH(rdma_req, &rqpair->outstanding_reqs, link) {
		if (rdma_req->bound && nvme_rdma_post_local_inv(rqpair, rdma_req) == 0)
			pending++;
	}

	while (pending > 0) {
		n = ibv_poll_cq(rqpair->cq, NVME_RDMA_POLL_BATCH, wc);
		if (n < 0)
			return -EIO;
		for (i = 0; i < n; i++) {
			rdma_wr = (struct nvme_rdma_wr *)(uintptr_t)wc[i].wr_id;
			if ((wc[i].opcode & IBV_WC_RECV) || rdma_wr->type != RDMA_WR_TYPE_INV)
				continue;
			rdma_req = SPDK_CONTAINEROF(rdma_wr, struct spdk_nvme_rdma_req, inv_rdma_wr);
			rdma_req->bound = (wc[i].status != IBV_WC_SUCCESS);
			pending--;
		}
	}

	TAILQ_FOREACH_SAFE(rdma_req, &rqpair->outstanding_reqs, link, tmp) {
		if (rdma_req->bound) {
			ibv_dealloc_mw(rdma_req->mw);
			rdma_req->mw = NULL;
			rdma_req->bound = false;
		}
		rdma_req->cpl.status = SPDK_NVME_SC_ABORTED_SQ_DELETION << 1;
		nvme_rdma_req_complete(rqpair, rdma_req); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV was reaped, windows that failed to invalidate were deallocated */
	}
	return 0;
}

int nvme_rdma_alloc_reqs(struct nvme_rdma_qpair *rqpair, struct ibv_pd *pd)
{
	struct spdk_nvme_rdma_req *rdma_req;
	uint16_t i;

	rqpair->rdma_reqs = calloc(rqpair->num_entries, sizeof(*rqpair->rdma_reqs));
	if (rqpair->rdma_reqs == NULL)
		return -ENOMEM;
	rqpair->cmd_mr = ibv_reg_mr(pd, rqpair->rdma_reqs,
				    rqpair->num_entries * sizeof(*rqpair->rdma_reqs), 0);
	if (rqpair->cmd_mr == NULL)
		goto fail_reg;

	TAILQ_INIT(&rqpair->free_reqs);
	TAILQ_INIT(&rqpair->outstanding_reqs);
	for (i = 0; i < rqpair->num_entries; i++) {
		rdma_req = &rqpair->rdma_reqs[i];
		rdma_req->id = i;
		rdma_req->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (rdma_req->mw == NULL)
			goto fail_mw;
		rdma_req->rkey = rdma_req->mw->rkey;
		rdma_req->bounce = (char *)rqpair->payload_mr->addr + (size_t)i * NVME_RDMA_BOUNCE_SIZE;

		rdma_req->rdma_wr.type = RDMA_WR_TYPE_SEND;
		rdma_req->bind_rdma_wr.type = RDMA_WR_TYPE_BIND;
		rdma_req->inv_rdma_wr.type = RDMA_WR_TYPE_INV;
		rdma_req->send_sgl.addr = (uintptr_t)&rdma_req->cmd;
		rdma_req->send_sgl.length = sizeof(rdma_req->cmd);
		rdma_req->send_sgl.lkey = rqpair->cmd_mr->lkey;
		rdma_req->send_wr.wr_id = (uintptr_t)&rdma_req->rdma_wr;
		rdma_req->send_wr.opcode = IBV_WR_SEND;
		rdma_req->send_wr.sg_list = &rdma_req->send_sgl;
		rdma_req->send_wr.num_sge = 1;
		rdma_req->send_wr.send_flags = IBV_SEND_SIGNALED;
		rdma_req->inv_wr.wr_id = (uintptr_t)&rdma_req->inv_rdma_wr;
		TAILQ_INSERT_TAIL(&rqpair->free_reqs, rdma_req, link);
	}
	return 0;

fail_mw:
	while (i-- > 0)
		ibv_dealloc_mw(rqpair->rdma_reqs[i].mw);
	ibv_dereg_mr(rqpair->cmd_mr);
fail_reg:
	free(rqpair->rdma_reqs);
	rqpair->rdma_reqs = NULL;
	return -ENOMEM;
}

void nvme_rdma_free_reqs(struct nvme_rdma_qpair *rqpair)
{
	uint16_t i;

	for (i = 0; i < rqpair->num_entries; i++) {
		if (rqpair->rdma_reqs[i].mw != NULL)
			ibv_dealloc_mw(rqpair->rdma_reqs[i].mw);
	}
	ibv_dereg_mr(rqpair->cmd_mr);
	free(rqpair->rdma_reqs); /* OK: rdma-invalidation-leak -- windows deallocated first */
	rqpair->rdma_reqs = NULL;
	TAILQ_INIT(&rqpair->free_reqs);
	TAILQ_INIT(&rqpair->outstanding_reqs);
}
