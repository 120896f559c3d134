/*
 * nvmf_rdma_tgt.c - per-qpair resources and the persistent memory region
 * for an NVMe-oF RDMA target (SPDK style).
 *
 * Every qpair owns a pool of requests; each request has a data buffer of one
 * I/O unit registered for local access at qpair creation, used as the local
 * side of the RDMA READs/WRITEs that move host data. Transfers larger than
 * an I/O unit get a one-off staging buffer registered for the request.
 * Capsules and completions live in two rings registered once.
 *
 * The target also exports a persistent memory region (PMR) that hosts write
 * to directly: it is registered in chunks with remote access and the chunk
 * keys are returned to each host in the RDMA_CM accept private data.
 *
 * Correct: the PMR chunk unwinding, leaving the PMR in its globals for
 * teardown, freeing the local-only data buffers ahead of deregistration.
 * Not correct: the request loop unwinds with `while (i-- > 0)` after the
 * current slot already holds its MR, the staging path leaks its MR when
 * the RDMA READ cannot be posted, and PMR teardown frees the region while
 * the chunk keys that hosts hold are still registered.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-registration-in-datapath, rdma-queue-cap-unchecked, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <endian.h>
#include <infiniband/verbs.h>

#define SPDK_ERRLOG(...)   fprintf(stderr, "nvmf_rdma: " __VA_ARGS__)

#define NVMF_RDMA_IO_UNIT_SIZE   (128 * 1024)
#define NVMF_RDMA_CAPSULE_SIZE   (64 + 4096)
#define NVMF_RDMA_CPL_SIZE       16
#define NVMF_RDMA_MD_SIZE        512
#define NVMF_PMR_MAX_CHUNKS      8
#define NVMF_PMR_CHUNK_SIZE      (2u * 1024 * 1024)

struct spdk_nvmf_rdma_qpair;

struct spdk_nvmf_rdma_request {
	uint16_t                        cid;
	struct spdk_nvmf_rdma_qpair     *qpair;
	struct {
		void                    *buf;
		struct ibv_mr           *mr;
		struct ibv_sge          sgl;
		struct ibv_send_wr      wr;
	} data;
	void                            *md;
	void                            *staging_buf;
	struct ibv_mr                   *staging_mr;
	uint32_t                        length;
	STAILQ_ENTRY(spdk_nvmf_rdma_request) link;
};

struct spdk_nvmf_rdma_resources {
	uint32_t                        depth;
	struct spdk_nvmf_rdma_request   *reqs;
	void                            *bufs;
	void                            *cmds;
	struct ibv_mr                   *cmds_mr;
	void                            *cpls;
	struct ibv_mr                   *cpls_mr;
	STAILQ_HEAD(, spdk_nvmf_rdma_request) free_queue;
};

struct spdk_nvmf_rdma_qpair {
	struct ibv_pd                   *pd;
	struct ibv_qp                   *qp;
	struct spdk_nvmf_rdma_resources *resources;
};

struct nvmf_rdma_pmr {
	void            *base;
	size_t          size;
	int             nchunks;
	struct ibv_mr   *mrs[NVMF_PMR_MAX_CHUNKS];
};

static struct nvmf_rdma_pmr g_pmr;

struct nvmf_rdma_accept_private_data {
	uint16_t        recfmt;
	uint16_t        crqsize;
	uint8_t         pmr_count;
	uint8_t         rsvd[3];
	struct {
		uint64_t        addr;
		uint32_t        rkey;
		uint32_t        length;
	} pmr[NVMF_PMR_MAX_CHUNKS];
} __attribute__((packed));

extern int spdk_nvmf_ctrlr_set_pmr(uint64_t size, int nchunks);

static struct spdk_nvmf_rdma_resources *
nvmf_rdma_resources_create(struct ibv_pd *pd, uint32_t depth)
{
	struct spdk_nvmf_rdma_resources *resources;
	struct spdk_nvmf_rdma_request *rdma_req;
	uint32_t i;

	resources = calloc(1, sizeof(*resources));
	if (!resources)
		return NULL;
	resources->depth = depth;
	STAILQ_INIT(&resources->free_queue);

	resources->reqs = calloc(depth, sizeof(*resources->reqs));
	resources->bufs = aligned_alloc(4096, (size_t)depth * NVMF_RDMA_IO_UNIT_SIZE);
	resources->cmds = aligned_alloc(4096, (size_t)depth * NVMF_RDMA_CAPSULE_SIZE);
	resources->cpls = aligned_alloc(4096, (size_t)depth * NVMF_RDMA_CPL_SIZE);
	if (!resources->reqs || !resources->bufs || !resources->cmds || !resources->cpls) {
		SPDK_ERRLOG("Unable to allocate resources for %u requests\n", depth);
		goto cleanup_mem;
	}

	resources->cmds_mr = ibv_reg_mr(pd, resources->cmds,
					(size_t)depth * NVMF_RDMA_CAPSULE_SIZE,
					IBV_ACCESS_LOCAL_WRITE); // OK: rdma-local-mr-management -- capsule receive ring, registered once for local access
	resources->cpls_mr = ibv_reg_mr(pd, resources->cpls,
					(size_t)depth * NVMF_RDMA_CPL_SIZE, 0); // OK: rdma-local-mr-management -- completion SEND buffers, registered once, local only
	if (!resources->cmds_mr || !resources->cpls_mr) {
		SPDK_ERRLOG("Unable to register capsule/completion rings\n");
		goto cleanup_rings;
	}

	for (i = 0; i < depth; i++) {
		rdma_req = &resources->reqs[i];
		rdma_req->cid = (uint16_t)i;
		rdma_req->data.buf = (char *)resources->bufs + (size_t)i * NVMF_RDMA_IO_UNIT_SIZE;
		rdma_req->data.mr = ibv_reg_mr(pd, rdma_req->data.buf,
					       NVMF_RDMA_IO_UNIT_SIZE,
					       IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- the lkey is the local side of the target's RDMA READ/WRITE data transfers
		if (!rdma_req->data.mr) {
			SPDK_ERRLOG("Unable to register data buffer %u\n", i);
			goto cleanup_reqs; // OK: rdma-mr-leak -- nothing is held for slot i here
		}

		rdma_req->md = calloc(1, NVMF_RDMA_MD_SIZE);
		if (!rdma_req->md) {
			SPDK_ERRLOG("Unable to allocate metadata for request %u\n", i);
			goto cleanup_reqs; // BUG: rdma-mr-leak -- slot i already holds data.mr; while (i-- > 0) starts below it
		}

		rdma_req->data.sgl.addr = (uintptr_t)rdma_req->data.buf;
		rdma_req->data.sgl.lkey = rdma_req->data.mr->lkey;
		rdma_req->data.wr.wr_id = (uintptr_t)rdma_req;
		rdma_req->data.wr.sg_list = &rdma_req->data.sgl;
		rdma_req->data.wr.num_sge = 1;
		STAILQ_INSERT_TAIL(&resources->free_queue, rdma_req, link);
	}
	return resources;

cleanup_reqs:
	while (i-- > 0) {
		ibv_dereg_mr(resources->reqs[i].data.mr);
		free(resources->reqs[i].md);
	}
cleanup_rings:
	if (resources->cpls_mr)
		ibv_dereg_mr(resources->cpls_mr);
	if (resources->cmds_mr)
		ibv_dereg_mr(resources->cmds_mr);
cleanup_mem:
	free(resources->cpls);
	free(resources->cmds);
	free(resources->bufs);
	free(resources->reqs);
	free(resources);
	return NULL;
}

static void
nvmf_rdma_resources_destroy(struct spdk_nvmf_rdma_resources *resources)
{
	uint32_t i;

	/* the data MRs are local-only; the pool can go first */
	free(resources->bufs); // OK: rdma-invalidation-leak -- local-only registrations, no key ever left the target
	for (i = 0; i < resources->depth; i++) {
		ibv_dereg_mr(resources->reqs[i].data.mr);
		free(resources->reqs[i].md);
	}
	ibv_dereg_mr(resources->cpls_mr);
	ibv_dereg_mr(resources->cmds_mr);
	free(resources->cpls);
	free(resources->cmds);
	free(resources->reqs);
	free(resources);
}

/* Host data for a WRITE command: pull it with RDMA READ into local buffers. */
int
nvmf_rdma_request_read_host_data(struct spdk_nvmf_rdma_qpair *rqpair,
				 struct spdk_nvmf_rdma_request *rdma_req,
				 uint64_t raddr, uint32_t rkey, uint32_t length)
{
	struct ibv_send_wr *bad_wr = NULL;
	struct ibv_sge *sge = &rdma_req->data.sgl;
	int rc;

	rdma_req->length = length;
	if (length <= NVMF_RDMA_IO_UNIT_SIZE) {
		sge->addr   = (uintptr_t)rdma_req->data.buf;
		sge->length = length;
		sge->lkey   = rdma_req->data.mr->lkey;
	} else {
		rdma_req->staging_buf = aligned_alloc(4096, length);
		if (!rdma_req->staging_buf)
			return -ENOMEM;
		rdma_req->staging_mr = ibv_reg_mr(rqpair->pd, rdma_req->staging_buf,
						  length, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-local-mr-management -- per-I/O registration of the RDMA READ sink
		if (!rdma_req->staging_mr) {
			free(rdma_req->staging_buf);
			rdma_req->staging_buf = NULL;
			return -ENOMEM;
		}
		sge->addr   = (uintptr_t)rdma_req->staging_buf;
		sge->length = length;
		sge->lkey   = rdma_req->staging_mr->lkey;
	}

	rdma_req->data.wr.opcode = IBV_WR_RDMA_READ;
	rdma_req->data.wr.send_flags = IBV_SEND_SIGNALED;
	rdma_req->data.wr.wr.rdma.remote_addr = raddr;
	rdma_req->data.wr.wr.rdma.rkey = rkey;

	rc = ibv_post_send(rqpair->qp, &rdma_req->data.wr, &bad_wr);
	if (rc) {
		SPDK_ERRLOG("Unable to post RDMA READ for cid %u: %d\n", rdma_req->cid, rc);
		free(rdma_req->staging_buf);
		rdma_req->staging_buf = NULL;
		return -rc; // BUG: rdma-mr-leak -- the staging MR is left registered over a freed buffer
	}
	return 0;
}

void
nvmf_rdma_request_free(struct spdk_nvmf_rdma_qpair *rqpair,
		       struct spdk_nvmf_rdma_request *rdma_req)
{
	if (rdma_req->staging_mr) {
		ibv_dereg_mr(rdma_req->staging_mr);
		rdma_req->staging_mr = NULL;
		free(rdma_req->staging_buf);
		rdma_req->staging_buf = NULL;
	}
	rdma_req->length = 0;
	STAILQ_INSERT_HEAD(&rqpair->resources->free_queue, rdma_req, link); // OK: rdma-invalidation-leak -- the request's MRs are local-only; nothing to invalidate
}

/* ---- persistent memory region ------------------------------------------ */

int
nvmf_rdma_pmr_create(struct ibv_pd *pd, size_t size)
{
	int i, j, nchunks;

	nchunks = (int)((size + NVMF_PMR_CHUNK_SIZE - 1) / NVMF_PMR_CHUNK_SIZE);
	if (nchunks > NVMF_PMR_MAX_CHUNKS)
		return -EINVAL;

	g_pmr.base = aligned_alloc(NVMF_PMR_CHUNK_SIZE, (size_t)nchunks * NVMF_PMR_CHUNK_SIZE);
	if (!g_pmr.base)
		return -ENOMEM;
	g_pmr.size = size;

	for (i = 0; i < nchunks; i++) {
		g_pmr.mrs[i] = ibv_reg_mr(pd, (char *)g_pmr.base + (size_t)i * NVMF_PMR_CHUNK_SIZE,
					  NVMF_PMR_CHUNK_SIZE,
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					  IBV_ACCESS_REMOTE_READ); // BUG: rdma-local-mr-management -- chunk keys are handed to every host in the accept data
		if (!g_pmr.mrs[i]) {
			SPDK_ERRLOG("Unable to register PMR chunk %d\n", i);
			for (j = i - 1; j >= 0; j--) {
				ibv_dereg_mr(g_pmr.mrs[j]);
				g_pmr.mrs[j] = NULL;
			}
			free(g_pmr.base); // OK: rdma-invalidation-leak -- every chunk was deregistered by the loop above
			g_pmr.base = NULL;
			return -ENOMEM; // OK: rdma-mr-leak -- the j = i - 1 .. 0 loop releases every chunk taken; slot i failed
		}
	}
	g_pmr.nchunks = nchunks;

	if (spdk_nvmf_ctrlr_set_pmr(size, nchunks) != 0) {
		SPDK_ERRLOG("Controller rejected a PMR of %zu bytes\n", size);
		return -EINVAL; // OK: rdma-mr-leak -- the chunks stay in g_pmr, which nvmf_rdma_pmr_destroy() releases
	}
	return 0;
}

void
nvmf_rdma_pmr_destroy(void)
{
	int i;

	free(g_pmr.base); // BUG: rdma-invalidation-leak -- hosts still hold the chunk keys; the chunks are deregistered only below
	g_pmr.base = NULL;
	for (i = 0; i < NVMF_PMR_MAX_CHUNKS; i++) {
		if (g_pmr.mrs[i]) {
			ibv_dereg_mr(g_pmr.mrs[i]);
			g_pmr.mrs[i] = NULL;
		}
	}
	g_pmr.nchunks = 0;
}

void
nvmf_rdma_fill_accept_data(struct spdk_nvmf_rdma_qpair *rqpair,
			   struct nvmf_rdma_accept_private_data *pd)
{
	uint32_t rkey;
	int i;

	memset(pd, 0, sizeof(*pd));
	pd->recfmt  = 0;
	pd->crqsize = htole16((uint16_t)(rqpair->resources->depth - 1));
	pd->pmr_count = (uint8_t)g_pmr.nchunks;
	for (i = 0; i < g_pmr.nchunks; i++) {
		rkey = htole32(g_pmr.mrs[i]->rkey);
		pd->pmr[i].addr = htole64((uintptr_t)g_pmr.mrs[i]->addr);
		memcpy(&pd->pmr[i].rkey, &rkey, sizeof(rkey));
		pd->pmr[i].length = htole32(NVMF_PMR_CHUNK_SIZE);
	}
}

int
nvmf_rdma_qpair_init(struct spdk_nvmf_rdma_qpair *rqpair, uint32_t depth)
{
	rqpair->resources = nvmf_rdma_resources_create(rqpair->pd, depth);
	if (!rqpair->resources)
		return -ENOMEM;
	return 0;
}

void
nvmf_rdma_qpair_fini(struct spdk_nvmf_rdma_qpair *rqpair)
{
	struct spdk_nvmf_rdma_resources *resources = rqpair->resources;
	uint32_t i;

	for (i = 0; i < resources->depth; i++) {
		if (resources->reqs[i].staging_mr) {
			ibv_dereg_mr(resources->reqs[i].staging_mr);
			resources->reqs[i].staging_mr = NULL;
			free(resources->reqs[i].staging_buf);
			resources->reqs[i].staging_buf = NULL;
		}
	}
	nvmf_rdma_resources_destroy(resources);
	rqpair->resources = NULL;
}
