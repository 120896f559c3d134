/*
 * nvmfh: the host (initiator) side of an NVMe-oF RDMA transport in the
 * style of SPDK.  All I/O memory comes from hugepage regions that the
 * environment reports through a memory-map notification; each region is
 * registered once on REGISTER (with remote read/write: commands carry
 * keyed SGLs pointing straight into it) and deregistered on UNREGISTER.
 * A command therefore costs exactly one send-queue entry (the command
 * SEND); there are no per-I/O registration work requests.
 *
 * Correct: queue sizing (2 x depth covers the command SEND plus the
 * occasional keep-alive/AER send per slot; no REG/INV WRs exist here),
 * keys written into each command's SGL.
 * Not correct: the UNREGISTER path clears the region's MR pointer without
 * deregistering it when the region is still referenced by in-flight
 * commands ("it will be cleaned up at shutdown" -- it is not: shutdown
 * only walks regions with a non-NULL MR).
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NVMFH_MAX_REGIONS	128

enum nvmfh_mem_event { NVMFH_MEM_REGISTER, NVMFH_MEM_UNREGISTER };

struct nvmfh_region {
	void          *vaddr;
	size_t         len;
	struct ibv_mr *mr;
	int            inflight;
};

struct nvmfh_ctrlr {
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	unsigned int        queue_depth;
	struct nvmfh_region regions[NVMFH_MAX_REGIONS];
};

struct nvmfh_sgl {
	uint64_t addr;
	uint8_t  len[3];
	uint8_t  key[4];
	uint8_t  type;
};

int nvmfh_mem_notify(struct nvmfh_ctrlr *c, enum nvmfh_mem_event ev, void *vaddr, size_t len)
{
	int i;

	if (ev == NVMFH_MEM_REGISTER) {
		for (i = 0; i < NVMFH_MAX_REGIONS; i++) {
			struct nvmfh_region *r = &c->regions[i];

			if (r->mr)
				continue;
			/* OK: rdma-remote-access-overbroad -- keys go into every command's keyed SGL */
			r->mr = ibv_reg_mr(c->pd, vaddr, len, // BUG: rdma-local-mr-management -- rkey handed to the target in commands
					   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
					   IBV_ACCESS_REMOTE_WRITE);
			if (!r->mr)
				return -errno;
			r->vaddr = vaddr;
			r->len = len;
			return 0;
		}
		return -ENOSPC;
	}

	for (i = 0; i < NVMFH_MAX_REGIONS; i++) {
		struct nvmfh_region *r = &c->regions[i];

		if (r->vaddr != vaddr || !r->mr)
			continue;
		if (r->inflight) {
			r->mr = NULL; // BUG: rdma-mr-leak -- the MR is dropped while still registered; nothing deregisters it later
			r->vaddr = NULL;
			return 0;
		}
		ibv_dereg_mr(r->mr);
		r->mr = NULL;
		r->vaddr = NULL;
		return 0;
	}
	return -ENOENT;
}

int nvmfh_create_qp(struct nvmfh_ctrlr *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-manual-factor -- no registration or invalidation WRs in this transport */
	/* OK: rdma-send-queue-undersized -- one command SEND per slot */
	attr.cap.max_send_wr = 2 * c->queue_depth;
	attr.cap.max_recv_wr = c->queue_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

static struct nvmfh_region *nvmfh_find(struct nvmfh_ctrlr *c, void *buf, uint32_t len)
{
	int i;

	for (i = 0; i < NVMFH_MAX_REGIONS; i++) {
		struct nvmfh_region *r = &c->regions[i];

		if (r->mr && (char *)buf >= (char *)r->vaddr &&
		    (char *)buf + len <= (char *)r->vaddr + r->len)
			return r;
	}
	return NULL;
}

int nvmfh_build_sgl(struct nvmfh_ctrlr *c, struct nvmfh_sgl *sgl, void *buf, uint32_t len)
{
	struct nvmfh_region *r = nvmfh_find(c, buf, len);
	uint32_t key;

	if (!r)
		return -EFAULT;
	key = r->mr->rkey;
	sgl->addr = htole64((uintptr_t)buf);
	sgl->len[0] = len & 0xff;
	sgl->len[1] = (len >> 8) & 0xff;
	sgl->len[2] = (len >> 16) & 0xff;
	memcpy(sgl->key, &key, 4);
	sgl->type = 0x40;
	r->inflight++;
	return 0;
}

int nvmfh_submit(struct nvmfh_ctrlr *c, void *cmd, uint32_t cmd_len, uint32_t lkey, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)cmd, cmd_len, lkey };
	struct ibv_send_wr wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	return ibv_post_send(c->qp, &wr, &bad);
}

void nvmfh_shutdown(struct nvmfh_ctrlr *c)
{
	int i;

	ibv_destroy_qp(c->qp);
	for (i = 0; i < NVMFH_MAX_REGIONS; i++)
		if (c->regions[i].mr)
			ibv_dereg_mr(c->regions[i].mr);
}
