/*
 * transport.c - devices, poll groups and the I/O state machine of the yb
 * NVMe-oF RDMA target.
 *
 * Host-to-controller data is pulled with RDMA READ into a buffer that the
 * bdev layer hands us; it is normally inside the hugepage memory map, but
 * some bdev modules hand back plain heap memory, which is then registered
 * for that one request and released when the response SEND completes.
 *
 * Each device also gets a small pool for admin-command data (identify,
 * log pages) that the target writes to the host.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "nvmf_rdma.h"

struct nvmf_admin_pool {
	void		*base;
	size_t		len;
	size_t		used;
	struct ibv_mr	*mr;
};

static struct nvmf_rdma_device g_devices[NVMF_RDMA_MAX_DEVICES];
static struct nvmf_admin_pool g_admin_pools[NVMF_RDMA_MAX_DEVICES];
static int g_num_devices;
static struct ibv_context **g_contexts;

/* bdev layer */
extern void *bdev_io_get_buf(uint16_t cid, uint32_t len);

#define NVME_SC_DATA_TRANSFER_ERROR	0x4
#define NVME_OPC_IDENTIFY		0x06
#define NVME_IDENTIFY_DATA_SIZE		4096

void
nvmf_rdma_transport_destroy(void)
{
	int i;

	for (i = 0; i < NVMF_RDMA_MAX_DEVICES; i++) {
		if (g_admin_pools[i].mr) {
			ibv_dereg_mr(g_admin_pools[i].mr);
			g_admin_pools[i].mr = NULL;
		}
		free(g_admin_pools[i].base);
		g_admin_pools[i].base = NULL;
		if (g_devices[i].pd) {
			ibv_dealloc_pd(g_devices[i].pd);
			g_devices[i].pd = NULL;
		}
	}
	if (g_contexts) {
		rdma_free_devices(g_contexts);
		g_contexts = NULL;
	}
	g_num_devices = 0;
}

int
nvmf_rdma_transport_create(void)
{
	struct nvmf_rdma_device *dev;
	struct nvmf_admin_pool *pool;
	int num, i;

	g_contexts = rdma_get_devices(&num);
	if (!g_contexts)
		return -ENODEV;

	for (i = 0; i < num && i < NVMF_RDMA_MAX_DEVICES; i++) {
		dev = &g_devices[i];
		dev->context = g_contexts[i];
		dev->index = i;
		dev->transport = g_contexts[i]->device->transport_type;
		if (ibv_query_device(dev->context, &dev->attr)) {
			NVMF_ERRLOG("ibv_query_device failed on %s\n",
				    ibv_get_device_name(dev->context->device));
			goto err;
		}
		dev->pd = ibv_alloc_pd(dev->context);
		if (!dev->pd)
			goto err;
		g_num_devices++;
	}

	for (i = 0; i < g_num_devices; i++) {
		pool = &g_admin_pools[i];
		pool->len = NVMF_ADMIN_POOL_SIZE;
		pool->base = aligned_alloc(4096, pool->len);
		if (!pool->base)
			goto err;
		// BUG: rdma-remote-access-overbroad -- the pool is only an RDMA WRITE source of the target; its rkey is never sent to a host
		pool->mr = ibv_reg_mr(g_devices[i].pd, pool->base, pool->len,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!pool->mr) {
			NVMF_ERRLOG("admin pool registration failed: %s\n", strerror(errno));
			goto err; // OK: rdma-mr-leak -- earlier pools stay in the global table that transport_destroy releases under a test
		}
	}
	return 0;

err:
	nvmf_rdma_transport_destroy();
	return -ENOMEM;
}

struct nvmf_rdma_poll_group *
nvmf_rdma_poll_group_create(int dev_index)
{
	struct nvmf_rdma_poll_group *pg;
	struct nvmf_rdma_device *device = &g_devices[dev_index];

	pg = calloc(1, sizeof(*pg));
	if (!pg)
		return NULL;
	pg->device = device;
	TAILQ_INIT(&pg->qpairs);

	pg->cq = ibv_create_cq(device->context, 4096, pg, NULL, 0);
	if (!pg->cq)
		goto err_free;

	pg->map = nvmf_mem_map_create(device->pd);
	if (!pg->map)
		goto err_cq;
	return pg;

err_cq:
	ibv_destroy_cq(pg->cq);
err_free:
	free(pg);
	return NULL;
}

void
nvmf_rdma_poll_group_destroy(struct nvmf_rdma_poll_group *pg)
{
	struct nvmf_rdma_qpair *rqpair;

	while ((rqpair = TAILQ_FIRST(&pg->qpairs)) != NULL) {
		TAILQ_REMOVE(&pg->qpairs, rqpair, link);
		nvmf_rdma_qpair_destroy(rqpair);
	}
	nvmf_mem_map_destroy(pg->map);
	ibv_destroy_cq(pg->cq);
	free(pg);
}

void
nvmf_rdma_request_free(struct nvmf_rdma_request *req)
{
	struct nvmf_rdma_qpair *rqpair = req->rqpair;

	req->state = RDMA_REQ_STATE_FREE;
	req->data = NULL;
	req->length = 0;
	STAILQ_INSERT_HEAD(&rqpair->free_reqs, req, link);
}

/* identify data is built in the device's admin pool and written to the host */
static void *
nvmf_admin_pool_get(int dev_index, uint16_t cid, uint32_t *lkey)
{
	struct nvmf_admin_pool *pool = &g_admin_pools[dev_index];
	size_t off = ((size_t)cid * NVME_IDENTIFY_DATA_SIZE) % pool->len;

	*lkey = pool->mr->lkey;
	return (char *)pool->base + off;
}

static uint32_t
nvmf_sgl_key(const struct nvme_sgl_keyed *sgl)
{
	return (uint32_t)sgl->key[0] | (uint32_t)sgl->key[1] << 8 |
	       (uint32_t)sgl->key[2] << 16 | (uint32_t)sgl->key[3] << 24;
}

static int
nvmf_rdma_request_fill_data(struct nvmf_rdma_request *req)
{
	struct nvmf_rdma_qpair *rqpair = req->rqpair;
	uint32_t lkey;

	if (nvmf_mem_map_translate(rqpair->pg->map, req->data, req->length,
				   &lkey) != 0) {
		/* not from the hugepage heap: register it for this I/O */
		// BUG: rdma-registration-in-datapath -- the bdev's buffer is registered once per request
		req->adhoc_mr = ibv_reg_mr(rqpair->pg->device->pd, req->data,
					   req->length, IBV_ACCESS_LOCAL_WRITE);
		if (!req->adhoc_mr)
			return -ENOMEM;
		lkey = req->adhoc_mr->lkey;
	}

	req->data_sge.addr = (uintptr_t)req->data;
	req->data_sge.length = req->length;
	req->data_sge.lkey = lkey;
	return 0;
}

static int
nvmf_rdma_request_transfer_h2c(struct nvmf_rdma_request *req)
{
	struct nvmf_rdma_qpair *rqpair = req->rqpair;
	struct ibv_send_wr *bad_wr = NULL;
	int rc;

	req->data_wr.wr_id = (uintptr_t)req;
	req->data_wr.next = NULL;
	req->data_wr.opcode = IBV_WR_RDMA_READ; // BUG: rdma-access-flags-transport -- the sink may be the per-request MR registered with LOCAL_WRITE only, which iWARP READ responses cannot target
	req->data_wr.send_flags = IBV_SEND_SIGNALED;
	req->data_wr.sg_list = &req->data_sge;
	req->data_wr.num_sge = 1;
	req->data_wr.wr.rdma.remote_addr = req->cmd->dptr.address;
	req->data_wr.wr.rdma.rkey = nvmf_sgl_key(&req->cmd->dptr);

	rc = ibv_post_send(rqpair->qp, &req->data_wr, &bad_wr);
	if (rc)
		return -rc;
	rqpair->sq_outstanding++;
	req->state = RDMA_REQ_STATE_TRANSFERRING_H2C;
	return 0;
}

static int
nvmf_rdma_request_complete(struct nvmf_rdma_request *req)
{
	struct nvmf_rdma_qpair *rqpair = req->rqpair;
	struct ibv_send_wr *first = &req->rsp_wr, *bad_wr = NULL;
	int rc;

	req->cpl->cid = req->cmd->cid;
	if (!req->h2c && req->length) {
		/* controller-to-host data goes out ahead of the response */
		req->data_wr.wr_id = (uintptr_t)req;
		req->data_wr.opcode = IBV_WR_RDMA_WRITE;
		req->data_wr.send_flags = 0;
		req->data_wr.sg_list = &req->data_sge;
		req->data_wr.num_sge = 1;
		req->data_wr.wr.rdma.remote_addr = req->cmd->dptr.address;
		req->data_wr.wr.rdma.rkey = nvmf_sgl_key(&req->cmd->dptr);
		req->data_wr.next = &req->rsp_wr;
		first = &req->data_wr;
	}
	req->rsp_wr.next = NULL;
	rc = ibv_post_send(rqpair->qp, first, &bad_wr);
	if (rc)
		return -rc;
	rqpair->sq_outstanding += (first == &req->rsp_wr) ? 1 : 2;
	req->state = RDMA_REQ_STATE_COMPLETING;
	return 0;
}

static void
nvmf_rdma_request_execute(struct nvmf_rdma_request *req)
{
	/* the bdev layer is synchronous in this build */
	req->state = RDMA_REQ_STATE_EXECUTING;
	req->cpl->status = 0;
	if (nvmf_rdma_request_complete(req)) {
		NVMF_ERRLOG("response post failed for cid %u\n", req->cmd->cid);
		req->state = RDMA_REQ_STATE_NEW;
	}
}

static int
nvmf_rdma_request_process(struct nvmf_rdma_request *req, void *bdev_buf)
{
	int rc;

	req->data = bdev_buf;
	req->length = req->cmd->dptr.length[0] |
		      req->cmd->dptr.length[1] << 8 |
		      req->cmd->dptr.length[2] << 16;
	req->h2c = (req->cmd->opc & 0x3) == 0x1;
	if (req->length > NVMF_MAX_IO_SIZE)
		return -EINVAL;

	if (req->cmd->opc == NVME_OPC_IDENTIFY) {
		req->h2c = false;
		req->length = NVME_IDENTIFY_DATA_SIZE;
		req->data = nvmf_admin_pool_get(req->rqpair->pg->device->index,
						req->cmd->cid, &req->data_sge.lkey);
		memset(req->data, 0, req->length);
		req->data_sge.addr = (uintptr_t)req->data;
		req->data_sge.length = req->length;
		nvmf_rdma_request_execute(req);
		return 0;
	}

	if (req->length) {
		rc = nvmf_rdma_request_fill_data(req);
		if (rc)
			return rc;
	}
	if (req->h2c && req->length) {
		rc = nvmf_rdma_request_transfer_h2c(req);
		if (rc == 0)
			return 0;
		/* fail the command; the response completion releases the request */
		req->cpl->status = NVME_SC_DATA_TRANSFER_ERROR << 1;
		req->h2c = false;
		req->length = 0;
		return nvmf_rdma_request_complete(req);
	}

	nvmf_rdma_request_execute(req);
	return 0;
}

static void
nvmf_rdma_handle_wc(struct nvmf_rdma_poll_group *pg, struct ibv_wc *wc)
{
	struct nvmf_rdma_request *req = (struct nvmf_rdma_request *)(uintptr_t)wc->wr_id;
	struct nvmf_rdma_qpair *rqpair = req->rqpair;

	(void)pg;
	if (wc->status != IBV_WC_SUCCESS) {
		NVMF_ERRLOG("wc error %s on opcode %d\n",
			    ibv_wc_status_str(wc->status), wc->opcode);
		return;
	}

	switch (wc->opcode) {
	case IBV_WC_RECV:
		req->state = RDMA_REQ_STATE_NEW;
		STAILQ_REMOVE(&rqpair->free_reqs, req, nvmf_rdma_request, link);
		if (nvmf_rdma_request_process(req,
				bdev_io_get_buf(req->cmd->cid, NVMF_MAX_IO_SIZE)))
			NVMF_ERRLOG("cid %u failed\n", req->cmd->cid);
		break;
	case IBV_WC_RDMA_READ:
		rqpair->sq_outstanding--;
		nvmf_rdma_request_execute(req);
		break;
	case IBV_WC_SEND:
		rqpair->sq_outstanding--;
		if (req->adhoc_mr) {
			ibv_dereg_mr(req->adhoc_mr); // BUG: rdma-registration-in-datapath -- the per-request registration is torn down in the completion handler
			req->adhoc_mr = NULL;
		}
		nvmf_rdma_request_free(req);
		break;
	default:
		break;
	}
}

int
nvmf_rdma_poll_group_poll(struct nvmf_rdma_poll_group *pg)
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(pg->cq, 32, wc);
	if (n < 0)
		return n;
	for (i = 0; i < n; i++)
		nvmf_rdma_handle_wc(pg, &wc[i]);
	return n;
}
