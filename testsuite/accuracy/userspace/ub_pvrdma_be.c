/*
 * ub_pvrdma_be.c - host RDMA backend of a paravirtual RDMA device model
 * (QEMU hw/rdma/rdma_backend.c + rdma_rm.c style).
 *
 * The guest driver issues commands (create MR, destroy MR, post send) on a
 * command channel.  For a guest MR the backend maps the guest's page list
 * into one contiguous host range (each page is mapped and then moved into
 * place with mremap, as rdma_rm_alloc_mr does), registers that range on
 * the host device on the guest's behalf and returns lkey and rkey in the
 * response.  Guest work requests are translated SGE by SGE: keys of guest
 * MRs map to the host MR, the guest's DMA lkey maps to a host registration
 * of the RAM chunk made on first use.  The backend also runs QP1 (GSI) for
 * the guest: a receive ring and a transmit slot table of MAD buffers.  A
 * guest reset tears down every resource.
 *
 * Not right: an MR leaked over already unmapped guest pages when the
 * resource table is full; per-WR registration of SGEs whose key the backend
 * does not know (and its deregistration in the completion); the per-WR
 * context freed with its MRs on a failed post; the reset path unmapping
 * guest memory before deregistering it; a GRH scratch buffer with remote
 * write; a GSI send queue smaller than the MAD slot table; a constant
 * receive depth above the portable floor.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>

#define BE_MAX_MRS		512
#define BE_PAGE_SIZE		4096ul
#define BE_CHUNK_SHIFT		30	/* guest RAM is registered in 1 GiB chunks */
#define BE_MAX_CHUNKS		64
#define BE_DMA_LKEY		0xffffff00u
#define BE_MAX_SGE		4
#define BE_MAD_SIZE		256
#define BE_MAD_TX_SLOTS		64
#define BE_MAD_RECVS		2048

/* guest memory access from the device model core */
extern void *guest_dma_map(void *pcidev, uint64_t gpa, size_t len);
extern void guest_dma_unmap(void *pcidev, void *hva, size_t len);
extern void *guest_ram_chunk(void *pcidev, unsigned int chunk, size_t *len);
extern void be_guest_cqe(void *gcq, uint64_t guest_wr_id, int status, uint32_t len);
extern void be_guest_mad_in(void *pcidev, const void *grh, const void *mad, uint32_t len);

/* guest-visible access bits (pvrdma ABI) */
enum { GA_LOCAL_WRITE = 1, GA_REMOTE_WRITE = 2, GA_REMOTE_READ = 4, GA_REMOTE_ATOMIC = 8 };

struct be_mr {
	int in_use;
	void *host_virt;	/* start of the contiguous host mapping */
	size_t map_len;
	struct ibv_mr *ibmr;
};

struct be_mad_tx {
	int busy;
	uint8_t *buf;
};

struct be_wr_ctx {
	void *gcq;
	uint64_t guest_wr_id;
	unsigned int ntmp;
	struct ibv_mr *tmp_mrs[BE_MAX_SGE];
};

struct be_dev {
	void *pcidev;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct be_mr mrs[BE_MAX_MRS];
	struct ibv_mr *chunk_mr[BE_MAX_CHUNKS];

	/* QP1 on behalf of the guest */
	struct ibv_cq *gsi_cq;
	struct ibv_qp *gsi_qp;
	uint8_t *mad_rx, *mad_txbuf, *grh_scratch;
	struct ibv_mr *mad_rx_mr, *mad_tx_mr, *grh_mr;
	struct be_mad_tx mad_tx[BE_MAD_TX_SLOTS];
};

struct be_cmd_create_mr {
	uint64_t start, length;
	uint64_t *page_list;	/* guest physical addresses */
	uint32_t npages, access_flags;
};

struct be_resp_create_mr { uint32_t handle, lkey, rkey; };

static int be_res_alloc(struct be_dev *dev)
{
	int i;

	for (i = 0; i < BE_MAX_MRS; i++) {
		if (!dev->mrs[i].in_use) {
			dev->mrs[i].in_use = 1;
			return i;
		}
	}
	return -1;
}

static int be_access(uint32_t gflags)
{
	int acc = 0;

	if (gflags & GA_REMOTE_READ)
		acc |= IBV_ACCESS_REMOTE_READ;
	if (gflags & GA_REMOTE_WRITE)
		acc |= IBV_ACCESS_REMOTE_WRITE;
	if (gflags & GA_REMOTE_ATOMIC)
		acc |= IBV_ACCESS_REMOTE_ATOMIC;
	/* the verbs require local write under remote write/atomic; old guests omit it */
	if (gflags & (GA_LOCAL_WRITE | GA_REMOTE_WRITE | GA_REMOTE_ATOMIC))
		acc |= IBV_ACCESS_LOCAL_WRITE;
	return acc;
}

/* map the guest page list into one contiguous host range */
static void *be_map_guest(struct be_dev *dev, const struct be_cmd_create_mr *cmd, size_t len)
{
	uint8_t *host, *page;
	uint32_t i;

	host = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (host == MAP_FAILED)
		return NULL;
	for (i = 0; i < cmd->npages; i++) {
		page = guest_dma_map(dev->pcidev, cmd->page_list[i], BE_PAGE_SIZE);
		if (!page || mremap(page, BE_PAGE_SIZE, BE_PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED,
				    host + i * BE_PAGE_SIZE) == MAP_FAILED) {
			munmap(host, len);
			return NULL;
		}
	}
	return host;
}

int be_create_mr(struct be_dev *dev, const struct be_cmd_create_mr *cmd,
		 struct be_resp_create_mr *resp)
{
	size_t map_len = (size_t)cmd->npages * BE_PAGE_SIZE;
	uint64_t off = cmd->start & (BE_PAGE_SIZE - 1);
	struct ibv_mr *mr;
	void *host;
	int acc, handle;

	if (!cmd->npages || off + cmd->length > map_len)
		return -EINVAL;
	host = be_map_guest(dev, cmd, map_len);
	if (!host)
		return -ENOMEM;

	acc = be_access(cmd->access_flags);
	/* BUG: rdma-local-mr-management -- registration on the guest's behalf; its rkey is handed back to the guest and on to its peers */
	mr = ibv_reg_mr(dev->pd, (uint8_t *)host + off, cmd->length, acc); /* OK: rdma-access-flags-invalid -- be_access() adds LOCAL_WRITE whenever remote write or atomic is granted */
	if (!mr) {
		munmap(host, map_len);
		return -errno;
	}

	handle = be_res_alloc(dev);
	if (handle < 0) {
		munmap(host, map_len); // BUG: rdma-invalidation-leak -- the guest pages are unmapped while the MR over them, with the guest's remote rights, stays registered
		return -ENOSPC; // BUG: rdma-mr-leak -- the host MR is dropped when the resource table is full
	}
	dev->mrs[handle].host_virt = host;
	dev->mrs[handle].map_len = map_len;
	dev->mrs[handle].ibmr = mr;

	resp->handle = handle;
	resp->lkey = mr->lkey;
	resp->rkey = (acc & ~IBV_ACCESS_LOCAL_WRITE) ? mr->rkey : 0; /* OK: rdma-remote-access-overbroad -- the guest gets the rkey for exactly the rights it asked for */
	return 0;
}

int be_destroy_mr(struct be_dev *dev, uint32_t handle)
{
	struct be_mr *m;

	if (handle >= BE_MAX_MRS || !dev->mrs[handle].in_use)
		return -EINVAL;
	m = &dev->mrs[handle];
	if (ibv_dereg_mr(m->ibmr))
		return -EBUSY;	/* still bound to a window, the guest retries */
	munmap(m->host_virt, m->map_len); /* OK: rdma-invalidation-leak -- the host MR (and its rkey) is gone before the guest pages are unmapped */
	m->ibmr = NULL;
	m->in_use = 0;
	return 0;
}

static uint32_t be_chunk_lkey(struct be_dev *dev, uint64_t gpa)
{
	unsigned int chunk = gpa >> BE_CHUNK_SHIFT;
	size_t len;
	void *hva;

	if (chunk >= BE_MAX_CHUNKS)
		return 0;
	if (!dev->chunk_mr[chunk]) {
		hva = guest_ram_chunk(dev->pcidev, chunk, &len);
		/* OK: rdma-registration-in-datapath -- a RAM chunk is registered on first use and kept */
		dev->chunk_mr[chunk] = ibv_reg_mr(dev->pd, hva, len, IBV_ACCESS_LOCAL_WRITE);
		if (!dev->chunk_mr[chunk])
			return 0;
	}
	return dev->chunk_mr[chunk]->lkey;
}

/* guest post_send on one of its QPs, translated to the host QP */
int be_post_send(struct be_dev *dev, struct ibv_qp *hqp, void *gcq, uint64_t guest_wr_id,
		 const struct ibv_sge *gsge, int nsge, enum ibv_wr_opcode opc,
		 unsigned int send_flags)
{
	struct ibv_sge sge[BE_MAX_SGE];
	struct ibv_send_wr wr, *bad;
	struct be_wr_ctx *ctx;
	struct ibv_mr *tmp;
	int i, h;

	if (nsge > BE_MAX_SGE)
		return -EINVAL;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	ctx->gcq = gcq;
	ctx->guest_wr_id = guest_wr_id;

	for (i = 0; i < nsge; i++) {
		sge[i].addr = gsge[i].addr;	/* guest physical; host address below */
		sge[i].length = gsge[i].length;
		if (gsge[i].lkey == BE_DMA_LKEY) {
			sge[i].lkey = be_chunk_lkey(dev, gsge[i].addr);
			sge[i].addr = (uintptr_t)guest_dma_map(dev->pcidev, gsge[i].addr, gsge[i].length);
			continue;
		}
		for (h = 0; h < BE_MAX_MRS; h++)
			if (dev->mrs[h].in_use && dev->mrs[h].ibmr->lkey == gsge[i].lkey)
				break;
		if (h < BE_MAX_MRS) {
			sge[i].lkey = gsge[i].lkey;
			continue;
		}
		/* key unknown to us (guest fast-registered it): register the pages for this WR */
		sge[i].addr = (uintptr_t)guest_dma_map(dev->pcidev, gsge[i].addr, gsge[i].length);
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the SGE's pages are registered for this one work request */
		tmp = ibv_reg_mr(dev->pd, (void *)(uintptr_t)sge[i].addr, sge[i].length,
				 IBV_ACCESS_LOCAL_WRITE);
		if (!tmp)
			goto err;
		ctx->tmp_mrs[ctx->ntmp++] = tmp;
		sge[i].lkey = tmp->lkey;
	}

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)ctx;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	wr.opcode = opc;
	wr.send_flags = send_flags;
	if (ibv_post_send(hqp, &wr, &bad))
		goto err;
	return 0;
err:
	free(ctx); // BUG: rdma-mr-leak -- the per-WR context is freed with the temporary MRs it holds
	return -EIO;
}

/* host CQ of a guest QP: forward completions, drop per-WR registrations */
int be_poll_guest_cq(struct be_dev *dev, struct ibv_cq *hcq)
{
	struct ibv_wc wc[8];
	struct be_wr_ctx *ctx;
	unsigned int j;
	int n, i;

	n = ibv_poll_cq(hcq, 8, wc);
	for (i = 0; i < n; i++) {
		ctx = (struct be_wr_ctx *)(uintptr_t)wc[i].wr_id;
		for (j = 0; j < ctx->ntmp; j++)
			ibv_dereg_mr(ctx->tmp_mrs[j]); // BUG: rdma-registration-in-datapath -- per-WR deregistration on every completion
		be_guest_cqe(ctx->gcq, ctx->guest_wr_id, wc[i].status, wc[i].byte_len);
		free(ctx);
	}
	return n;
}

int be_gsi_init(struct be_dev *dev)
{
	struct ibv_qp_init_attr attr;
	int i;

	dev->gsi_cq = ibv_create_cq(dev->ctx, 32 + BE_MAD_RECVS, NULL, NULL, 0);
	if (!dev->gsi_cq)
		return -errno;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = attr.recv_cq = dev->gsi_cq;
	attr.qp_type = IBV_QPT_UD;
	attr.sq_sig_all = 0;
	/* BUG(file): rdma-send-queue-undersized -- all 64 MAD transmit slots can be in flight on a 32-entry send queue */
	attr.cap.max_send_wr = 32;	/* QP1 traffic is light */
	attr.cap.max_recv_wr = BE_MAD_RECVS; // BUG(file): rdma-queue-cap-unchecked -- 2048 receive WRs requested without comparing with max_qp_wr
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 2;
	dev->gsi_qp = ibv_create_qp(dev->pd, &attr);
	if (!dev->gsi_qp)
		goto err_cq;

	dev->mad_rx = calloc(BE_MAD_RECVS, BE_MAD_SIZE);
	dev->mad_txbuf = calloc(BE_MAD_TX_SLOTS, BE_MAD_SIZE);
	dev->grh_scratch = calloc(1, 40);
	if (!dev->mad_rx || !dev->mad_txbuf || !dev->grh_scratch)
		goto err_bufs;
	/* OK: rdma-local-mr-management -- receive ring registered once for local access */
	dev->mad_rx_mr = ibv_reg_mr(dev->pd, dev->mad_rx, BE_MAD_RECVS * BE_MAD_SIZE, IBV_ACCESS_LOCAL_WRITE);
	dev->mad_tx_mr = ibv_reg_mr(dev->pd, dev->mad_txbuf, BE_MAD_TX_SLOTS * BE_MAD_SIZE, 0);
	dev->grh_mr = ibv_reg_mr(dev->pd, dev->grh_scratch, 40,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG(file): rdma-remote-access-overbroad -- the GRH sink only ever needs local write; its rkey goes nowhere
	if (!dev->mad_rx_mr || !dev->mad_tx_mr || !dev->grh_mr)
		goto err_mrs;

	for (i = 0; i < BE_MAD_TX_SLOTS; i++)
		dev->mad_tx[i].buf = dev->mad_txbuf + i * BE_MAD_SIZE;
	for (i = 0; i < BE_MAD_RECVS; i++) {
		struct ibv_sge sge[2] = {
			{ (uintptr_t)dev->grh_scratch, 40, dev->grh_mr->lkey },
			{ (uintptr_t)(dev->mad_rx + i * BE_MAD_SIZE), BE_MAD_SIZE, dev->mad_rx_mr->lkey },
		};
		struct ibv_recv_wr rwr = { .wr_id = i, .sg_list = sge, .num_sge = 2 }, *bad;

		if (ibv_post_recv(dev->gsi_qp, &rwr, &bad))
			goto err_mrs;
	}
	return 0;

err_mrs:
	if (dev->grh_mr)
		ibv_dereg_mr(dev->grh_mr);
	if (dev->mad_tx_mr)
		ibv_dereg_mr(dev->mad_tx_mr);
	if (dev->mad_rx_mr)
		ibv_dereg_mr(dev->mad_rx_mr); /* OK: rdma-mr-leak -- every GSI registration is undone on failure */
err_bufs:
	free(dev->grh_scratch);
	free(dev->mad_txbuf);
	free(dev->mad_rx);
	ibv_destroy_qp(dev->gsi_qp);
err_cq:
	ibv_destroy_cq(dev->gsi_cq);
	return -ENOMEM;
}

/* guest sends a MAD through QP1 */
int be_send_mad(struct be_dev *dev, struct ibv_ah *ah, uint32_t remote_qpn,
		const void *mad, size_t len)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	int i;

	for (i = 0; i < BE_MAD_TX_SLOTS; i++)
		if (!dev->mad_tx[i].busy)
			break;
	if (i == BE_MAD_TX_SLOTS || len > BE_MAD_SIZE)
		return -EAGAIN;
	dev->mad_tx[i].busy = 1;
	memcpy(dev->mad_tx[i].buf, mad, len);

	sge = (struct ibv_sge){ (uintptr_t)dev->mad_tx[i].buf, (uint32_t)len, dev->mad_tx_mr->lkey };
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = BE_MAD_RECVS + i;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- every MAD send asks for its completion, which frees the slot */
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = remote_qpn;
	wr.wr.ud.remote_qkey = 0x80010000;
	if (ibv_post_send(dev->gsi_qp, &wr, &bad)) {
		dev->mad_tx[i].busy = 0;
		return -EIO;
	}
	return 0;
}

int be_gsi_poll(struct be_dev *dev)
{
	struct ibv_wc wc[16];
	struct ibv_recv_wr rwr, *bad;
	struct ibv_sge sge[2];
	int n, i;

	n = ibv_poll_cq(dev->gsi_cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].wr_id >= BE_MAD_RECVS) {	/* MAD send done, slot is free */
			dev->mad_tx[wc[i].wr_id - BE_MAD_RECVS].busy = 0;
			continue;
		}
		if (wc[i].status == IBV_WC_SUCCESS)
			be_guest_mad_in(dev->pcidev, dev->grh_scratch,
					dev->mad_rx + wc[i].wr_id * BE_MAD_SIZE, wc[i].byte_len - 40);
		sge[0] = (struct ibv_sge){ (uintptr_t)dev->grh_scratch, 40, dev->grh_mr->lkey };
		sge[1] = (struct ibv_sge){ (uintptr_t)(dev->mad_rx + wc[i].wr_id * BE_MAD_SIZE),
					   BE_MAD_SIZE, dev->mad_rx_mr->lkey };
		rwr = (struct ibv_recv_wr){ .wr_id = wc[i].wr_id, .sg_list = sge, .num_sge = 2 };
		ibv_post_recv(dev->gsi_qp, &rwr, &bad);
	}
	return n;
}

/* guest reset: drop everything the guest created, the guest RAM is reused */
void be_reset(struct be_dev *dev)
{
	int i;

	for (i = 0; i < BE_MAX_MRS; i++) {
		struct be_mr *m = &dev->mrs[i];

		if (!m->in_use)
			continue;
		munmap(m->host_virt, m->map_len); // BUG: rdma-invalidation-leak -- guest pages are unmapped (and reused by the rebooted guest) while the host MR and the rkey given to the guest's peers are still valid
		ibv_dereg_mr(m->ibmr);
		m->ibmr = NULL;
		m->in_use = 0;
	}
	for (i = 0; i < BE_MAX_CHUNKS; i++) {
		if (dev->chunk_mr[i]) {
			ibv_dereg_mr(dev->chunk_mr[i]);
			dev->chunk_mr[i] = NULL;
		}
	}
	for (i = 0; i < BE_MAD_TX_SLOTS; i++)
		dev->mad_tx[i].busy = 0;
}
