/*
 * An NVMe-oF RDMA target transport in the style of SPDK's nvmf/rdma.c.
 *
 * Data buffers live in hugepage regions that are registered once, when the
 * memory map reports them (tgt_mem_notify), and looked up per request.  A
 * request costs at most two send-queue entries: one RDMA READ or WRITE for
 * its data and the response SEND (SEND_WITH_INV when the host asked for its
 * key to be invalidated).  The queue is therefore sized 2 * depth, and the
 * depth is clamped to the device's max_qp_wr first.
 *
 * Correct: queue sizing (the factor counts data WRs only; nothing here
 * posts registration or invalidation work requests), capabilities derived
 * from the device, every response SEND signaled.
 * Not correct: the buffer access flags are chosen by an inline transport
 * test (iWARP READ sinks need REMOTE_WRITE) instead of one
 * transport-independent rule.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TGT_DEFAULT_QUEUE_DEPTH	128
#define TGT_MAX_REGIONS		64

struct tgt_mem_region {
	void          *vaddr;
	size_t         len;
	struct ibv_mr *mr;
};

struct tgt_device {
	struct ibv_context    *context;
	struct ibv_pd         *pd;
	struct ibv_device_attr attr;
	struct tgt_mem_region  regions[TGT_MAX_REGIONS];
	int                    nregions;
};

struct nvme_sgl_keyed {
	uint64_t address;
	uint8_t  length[3];
	uint8_t  key[4];
	uint8_t  subtype_type;
};

struct tgt_cmd {
	uint8_t               opc;
	uint8_t               flags;
	uint16_t              cid;
	uint32_t              nsid;
	uint64_t              rsvd[2];
	struct nvme_sgl_keyed sgl;
	uint32_t              cdw10_15[6];
};

struct tgt_cpl {
	uint32_t cdw0, rsvd;
	uint16_t sqhd, sqid, cid, status;
};

struct tgt_request {
	struct tgt_qpair  *qpair;
	struct tgt_cmd    *cmd;
	struct tgt_cpl     rsp;
	void              *data;
	uint32_t           length;
	uint32_t           remote_key;
	uint64_t           remote_addr;
	int                invalidate;
	struct ibv_sge     data_sge;
	struct ibv_sge     rsp_sge;
	struct ibv_send_wr data_wr;
	struct ibv_send_wr rsp_wr;
};

struct tgt_qpair {
	struct tgt_device *dev;
	struct ibv_cq     *cq;
	struct ibv_qp     *qp;
	uint32_t           max_queue_depth;
	struct ibv_mr     *rsp_mr;
};

int tgt_mem_notify(struct tgt_device *dev, void *vaddr, size_t len)
{
	struct tgt_mem_region *r;
	int access = IBV_ACCESS_LOCAL_WRITE;

	if (dev->nregions == TGT_MAX_REGIONS)
		return -ENOSPC;
	r = &dev->regions[dev->nregions];
	if (dev->context->device->transport_type == IBV_TRANSPORT_IWARP)
		access |= IBV_ACCESS_REMOTE_WRITE; /* iWARP needs it for RDMA READ */
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE only where the transport needs it for READ sinks */
	r->mr = ibv_reg_mr(dev->pd, vaddr, len, access); // BUG: rdma-access-flags-transport, rdma-local-mr-management -- flags picked by an inline transport test; the MR addresses the target's own READ/WRITE
	if (!r->mr)
		return -errno;
	r->vaddr = vaddr;
	r->len = len;
	dev->nregions++;
	return 0;
}

static uint32_t tgt_lookup_lkey(struct tgt_device *dev, void *addr, uint32_t len)
{
	int i;

	for (i = 0; i < dev->nregions; i++) {
		char *base = dev->regions[i].vaddr;

		if ((char *)addr >= base && (char *)addr + len <= base + dev->regions[i].len)
			return dev->regions[i].mr->lkey;
	}
	return 0;
}

int tgt_qpair_init(struct tgt_qpair *q, struct tgt_device *dev, struct ibv_cq *cq,
		   uint32_t wanted_depth)
{
	struct ibv_qp_init_attr qp_init_attr;

	q->dev = dev;
	q->cq = cq;
	q->max_queue_depth = wanted_depth ? wanted_depth : TGT_DEFAULT_QUEUE_DEPTH;
	if (q->max_queue_depth * 2 > (uint32_t)dev->attr.max_qp_wr)
		q->max_queue_depth = dev->attr.max_qp_wr / 2;

	memset(&qp_init_attr, 0, sizeof(qp_init_attr));
	qp_init_attr.send_cq = cq;
	qp_init_attr.recv_cq = cq;
	qp_init_attr.qp_type = IBV_QPT_RC;
	/* SEND, and READ or WRITE operations */
	/* OK: rdma-send-queue-manual-factor -- the factor counts data WRs; no registration WRs are posted */
	/* OK: rdma-send-queue-undersized -- one data WR and one response SEND per request */
	qp_init_attr.cap.max_send_wr = (uint32_t)q->max_queue_depth * 2;
	qp_init_attr.cap.max_recv_wr = q->max_queue_depth;
	/* OK: rdma-queue-cap-unchecked -- SGE counts from the device */
	qp_init_attr.cap.max_send_sge = dev->attr.max_sge < 4 ? dev->attr.max_sge : 4;
	qp_init_attr.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(dev->pd, &qp_init_attr);
	return q->qp ? 0 : -errno;
}

static void tgt_build_rsp(struct tgt_qpair *q, struct tgt_request *req)
{
	req->rsp.cid = req->cmd->cid;
	req->rsp_sge.addr = (uintptr_t)&req->rsp;
	req->rsp_sge.length = sizeof(req->rsp);
	req->rsp_sge.lkey = q->rsp_mr->lkey;
	memset(&req->rsp_wr, 0, sizeof(req->rsp_wr));
	req->rsp_wr.wr_id = (uintptr_t)req;
	req->rsp_wr.sg_list = &req->rsp_sge;
	req->rsp_wr.num_sge = 1;
	req->rsp_wr.send_flags = IBV_SEND_SIGNALED;
	if (req->invalidate) {
		req->rsp_wr.opcode = IBV_WR_SEND_WITH_INV;
		req->rsp_wr.invalidate_rkey = req->remote_key;
	} else {
		req->rsp_wr.opcode = IBV_WR_SEND;
	}
}

/* controller-to-host: WRITE the data, then the response, one post */
int tgt_request_complete_read(struct tgt_qpair *q, struct tgt_request *req)
{
	struct ibv_send_wr *bad;

	req->data_sge.addr = (uintptr_t)req->data;
	req->data_sge.length = req->length;
	req->data_sge.lkey = tgt_lookup_lkey(q->dev, req->data, req->length);
	memset(&req->data_wr, 0, sizeof(req->data_wr));
	req->data_wr.opcode = IBV_WR_RDMA_WRITE;
	req->data_wr.sg_list = &req->data_sge;
	req->data_wr.num_sge = 1;
	req->data_wr.wr.rdma.remote_addr = req->remote_addr;
	req->data_wr.wr.rdma.rkey = req->remote_key;
	tgt_build_rsp(q, req);
	req->data_wr.next = &req->rsp_wr;
	return ibv_post_send(q->qp, &req->data_wr, &bad);
}

/* host-to-controller: READ the data first; the response goes out after the command ran */
int tgt_request_fetch_data(struct tgt_qpair *q, struct tgt_request *req)
{
	struct ibv_send_wr *bad;

	req->data_sge.addr = (uintptr_t)req->data;
	req->data_sge.length = req->length;
	req->data_sge.lkey = tgt_lookup_lkey(q->dev, req->data, req->length);
	memset(&req->data_wr, 0, sizeof(req->data_wr));
	req->data_wr.wr_id = (uintptr_t)req;
	req->data_wr.opcode = IBV_WR_RDMA_READ;
	req->data_wr.send_flags = IBV_SEND_SIGNALED;
	req->data_wr.sg_list = &req->data_sge;
	req->data_wr.num_sge = 1;
	req->data_wr.wr.rdma.remote_addr = req->remote_addr;
	req->data_wr.wr.rdma.rkey = req->remote_key;
	/* OK: rdma-access-flags-transport -- not a sink-rights bug: iWARP sinks get REMOTE_WRITE (the inline test is reported at the registration) */
	return ibv_post_send(q->qp, &req->data_wr, &bad);
}

int tgt_request_send_rsp(struct tgt_qpair *q, struct tgt_request *req)
{
	struct ibv_send_wr *bad;

	tgt_build_rsp(q, req);
	return ibv_post_send(q->qp, &req->rsp_wr, &bad);
}

void tgt_parse_sgl(struct tgt_request *req)
{
	struct nvme_sgl_keyed *sgl = &req->cmd->sgl;

	req->remote_addr = le64toh(sgl->address);
	req->length = sgl->length[0] | sgl->length[1] << 8 | sgl->length[2] << 16;
	req->remote_key = sgl->key[0] | sgl->key[1] << 8 | sgl->key[2] << 16 |
			  (uint32_t)sgl->key[3] << 24;
	req->invalidate = (sgl->subtype_type & 0xf) == 0xf;
}
