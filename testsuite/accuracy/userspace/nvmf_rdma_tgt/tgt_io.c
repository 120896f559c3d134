/*
 * tgt_io.c - request execution of the NVMe-oF RDMA target.
 *
 * Host writes: the data is pulled with RDMA READs (one per keyed SGL
 * descriptor), the last one signaled; the backend I/O starts from its
 * completion and the NVMe completion is sent afterwards.  Host reads: the
 * backend fills the buffer, then RDMA WRITEs chained to the completion
 * SEND push data and status in one post.
 *
 * Small writes whose data the host did not put in the capsule are pulled
 * into the slot's in-capsule buffer.  Backends that hand out their own
 * (zero-copy) buffers get them registered by 2 MiB region, cached.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "tgt_rdma.h"

#define NVME_OPC_WRITE      0x01
#define NVME_OPC_READ       0x02
#define TGT_EXT_REGION      (2UL * 1024 * 1024)
#define TGT_EXT_SLOTS       4096

enum { REQ_IDLE, REQ_PULLING, REQ_EXECUTING, REQ_COMPLETING };

static struct {
	uintptr_t        base;
	struct ibv_mr   *mr;
} g_ext_cache[TGT_EXT_SLOTS];

int tgt_backend_submit(struct tgt_request *req);

/* one data work request per keyed SGL descriptor, chained */
static void tgt_build_data_wrs(struct tgt_request *req, enum ibv_wr_opcode opcode,
			       uint32_t lkey, char *buf)
{
	struct nvme_cmd *cmd = req->cmd;
	uint32_t off = 0;
	int i;

	for (i = 0; i < cmd->nsgl && i < TGT_MAX_SGL_DESC; i++) {
		struct ibv_send_wr *wr = &req->data.wr[i];

		req->data.sge[i].addr = (uintptr_t)(buf + off);
		req->data.sge[i].length = cmd->sgl[i].length;
		req->data.sge[i].lkey = lkey;
		memset(wr, 0, sizeof(*wr));
		wr->wr_id = (uintptr_t)req;
		wr->opcode = opcode;
		wr->sg_list = &req->data.sge[i];
		wr->num_sge = 1;
		wr->wr.rdma.remote_addr = cmd->sgl[i].address;
		wr->wr.rdma.rkey = cmd->sgl[i].key;
		if (i > 0)
			req->data.wr[i - 1].next = wr;
		off += cmd->sgl[i].length;
	}
	req->data.num_wrs = i;
	req->length = off;
}

static void tgt_build_rsp(struct tgt_request *req)
{
	struct tgt_resources *res = req->qpair->res;

	req->cpl->cid = req->cmd->cid;
	req->rsp_sge.addr = (uintptr_t)req->cpl;
	req->rsp_sge.length = sizeof(*req->cpl);
	req->rsp_sge.lkey = res->cpls_mr->lkey;
	memset(&req->rsp_wr, 0, sizeof(req->rsp_wr));
	req->rsp_wr.wr_id = (uintptr_t)req;
	req->rsp_wr.opcode = IBV_WR_SEND;
	req->rsp_wr.send_flags = IBV_SEND_SIGNALED;
	req->rsp_wr.sg_list = &req->rsp_sge;
	req->rsp_wr.num_sge = 1;
}

static int tgt_post_pull(struct tgt_request *req)
{
	struct ibv_send_wr *bad;

	req->data.wr[req->data.num_wrs - 1].send_flags = IBV_SEND_SIGNALED;
	req->state = REQ_PULLING;
	return ibv_post_send(req->qpair->qp, &req->data.wr[0], &bad);
}

/* small write without in-capsule data: pull it into the slot's buffer */
static int tgt_exec_small_write(struct tgt_request *req)
{
	struct tgt_resources *res = req->qpair->res;
	char *inbuf = res->bufs + (size_t)req->slot * TGT_IN_CAPSULE_SIZE;

	req->buf = inbuf;
	req->in_capsule = 1;
	// BUG: rdma-access-flags-transport -- READ into in-capsule buffers registered by rdma_reg_msgs (local write only); fails on iWARP
	tgt_build_data_wrs(req, IBV_WR_RDMA_READ, res->bufs_mr->lkey, inbuf);
	return tgt_post_pull(req);
}

static int tgt_exec_rw(struct tgt_request *req, int is_write)
{
	req->buf = tgt_data_buf_get();
	if (!req->buf)
		return -EAGAIN;
	/* OK: rdma-access-flags-transport -- the data pool is given REMOTE_WRITE on iWARP devices */
	tgt_build_data_wrs(req, is_write ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, tgt_data_lkey(), req->buf);
	if (is_write)
		return tgt_post_pull(req);
	req->state = REQ_EXECUTING;
	return tgt_backend_submit(req);
}

/* lkey of a backend buffer: registration cache of 2 MiB regions */
static uint32_t tgt_ext_lkey(struct tgt_rdma_qpair *rq, void *buf)
{
	uintptr_t base = (uintptr_t)buf & ~(TGT_EXT_REGION - 1);
	unsigned int idx = (base / TGT_EXT_REGION) % TGT_EXT_SLOTS;

	if (g_ext_cache[idx].mr && g_ext_cache[idx].base == base)
		return g_ext_cache[idx].mr->lkey;
	if (g_ext_cache[idx].mr)
		ibv_dereg_mr(g_ext_cache[idx].mr);	/* evict the victim */
	/* OK: rdma-registration-in-datapath -- a cache: registers only on a miss and keeps the region */
	g_ext_cache[idx].mr = ibv_reg_mr(rq->pd, (void *)base, TGT_EXT_REGION, IBV_ACCESS_LOCAL_WRITE);	// BUG: rdma-local-mr-management -- backend buffers registered by hand for the target's own RDMA
	g_ext_cache[idx].base = g_ext_cache[idx].mr ? base : 0;
	return g_ext_cache[idx].mr ? g_ext_cache[idx].mr->lkey : 0;
}

static int tgt_exec_zcopy(struct tgt_request *req, void *buf, int is_write)
{
	req->buf = buf;
	req->zcopy = 1;
	// BUG: rdma-access-flags-transport -- for host writes this READs into backend buffers registered without REMOTE_WRITE
	tgt_build_data_wrs(req, is_write ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, tgt_ext_lkey(req->qpair, buf), buf);
	if (is_write)
		return tgt_post_pull(req);
	req->state = REQ_EXECUTING;
	return tgt_backend_submit(req);
}

int tgt_request_exec(struct tgt_request *req, void *backend_buf)
{
	struct nvme_cmd *cmd = req->cmd;
	int is_write = cmd->opc == NVME_OPC_WRITE;

	req->zcopy = req->in_capsule = 0;
	tgt_build_rsp(req);
	if (is_write && cmd->nsgl == 1 && cmd->sgl[0].length <= TGT_IN_CAPSULE_SIZE)
		return tgt_exec_small_write(req);
	if (backend_buf)
		return tgt_exec_zcopy(req, backend_buf, is_write);
	return tgt_exec_rw(req, is_write);
}

/* backend finished: writes send the completion, reads push data + completion */
void tgt_request_backend_done(struct tgt_request *req)
{
	struct ibv_send_wr *first = &req->rsp_wr, *bad;

	if (req->cmd->opc == NVME_OPC_READ) {
		req->data.wr[req->data.num_wrs - 1].next = &req->rsp_wr;
		first = &req->data.wr[0];
	}
	req->state = REQ_COMPLETING;
	if (ibv_post_send(req->qpair->qp, first, &bad))
		req->cpl->status = 0x6;		/* internal error; the qpair is torn down */
}

static void tgt_request_release(struct tgt_request *req)
{
	struct tgt_resources *res = req->qpair->res;
	struct ibv_recv_wr *bad;
	struct ibv_sge sgl[2] = {
		{ (uintptr_t)req->cmd, sizeof(*req->cmd), res->cmds_mr->lkey },
		{ (uintptr_t)(res->bufs + (size_t)req->slot * TGT_IN_CAPSULE_SIZE), TGT_IN_CAPSULE_SIZE, res->bufs_mr->lkey },
	};

	if (req->buf && !req->zcopy && !req->in_capsule)
		tgt_data_buf_put(req->buf);
	req->buf = NULL;
	req->state = REQ_IDLE;
	req->recv_wr.sg_list = sgl;
	req->recv_wr.num_sge = 2;
	ibv_post_recv(req->qpair->qp, &req->recv_wr, &bad);
}

void tgt_process_send_cq(struct tgt_rdma_qpair *rq, struct ibv_wc *wc, int n)
{
	int i;

	(void)rq;
	for (i = 0; i < n; i++) {
		struct tgt_request *req = (struct tgt_request *)(uintptr_t)wc[i].wr_id;

		if (wc[i].status != IBV_WC_SUCCESS) {
			tgt_request_release(req);
			continue;
		}
		if (wc[i].opcode == IBV_WC_RDMA_READ) {
			req->state = REQ_EXECUTING;
			tgt_backend_submit(req);
		} else if (wc[i].opcode == IBV_WC_SEND) {
			tgt_request_release(req);
		}
	}
}
