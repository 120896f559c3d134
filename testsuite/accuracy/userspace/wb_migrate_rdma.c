/*
 * wb_migrate_rdma.c - RAM transport for live migration over rdma_cm,
 * after QEMU's migration/rdma.c.
 *
 * The source pushes dirty chunks of guest RAM into the destination with
 * RDMA WRITE.  In pin-all mode both sides register every RAM block at
 * setup and exchange the block list; otherwise the destination registers
 * 1 MiB chunks on the source's REGISTER_REQUEST and answers with the rkey.
 * Postcopy: the destination pulls faulting pages from the source with
 * RDMA READ.  Control messages are SENDs on the same RC QP.
 *
 * Known problems: the write signaling counter is never advanced, the
 * destination's pin-all registration forgets LOCAL_WRITE, the control
 * receive buffer is registered with remote write, device state is
 * registered per transfer, and the postcopy staging buffer is an RDMA
 * READ sink without remote write (fails on iWARP).
 *
 * NOT-ANNOTATED: rdma-send-queue-undersized, rdma-invalidation-leak, rdma-mr-leak, rdma-rkey-reuse, rdma-unmap-before-invalidate, rdma-local-mr-management, rdma-send-queue-manual-factor -- not reviewed for this transport
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdbool.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <infiniband/verbs.h>

#define RDMA_CHUNK_SHIFT	20
#define RDMA_CHUNK_SIZE		(1UL << RDMA_CHUNK_SHIFT)
#define RDMA_SEND_DEPTH		512
#define RDMA_CONTROL_RECVS	3
#define RDMA_WRITE_SIGNAL_EVERY	64
#define RDMA_CTRL_BUF		4096
#define MIG_PAGE		4096UL
#define MIG_PAGE_BATCH		64

enum {
	WRID_NONE = 0,
	WRID_RDMA_WRITE,
	WRID_SEND_CONTROL,
	WRID_RECV_CONTROL,
	WRID_PAGE_READ,
};

enum mig_ctrl_type {
	CTRL_READY = 1,
	CTRL_RAM_BLOCKS,
	CTRL_REGISTER_REQUEST,
	CTRL_REGISTER_RESULT,
	CTRL_DEVICE_STATE,
	CTRL_QUIT,
};

struct mig_ctrl_hdr {
	uint32_t type;
	uint32_t len;
};

struct mig_reg_req {
	uint32_t block;
	uint32_t chunk;
};

struct mig_reg_result {
	uint64_t host_addr;
	uint32_t rkey;
	uint32_t pad;
};

struct mig_block_desc {
	uint64_t host_addr;
	uint64_t length;
	uint32_t rkey;
	uint32_t pad;
};

struct ram_block {
	char		 *host;
	uint64_t	  length;
	unsigned	  nb_chunks;
	struct ibv_mr	 *mr;		/* pin-all */
	struct ibv_mr	**pmr;		/* per chunk */
	uint32_t	 *remote_keys;	/* source: per-chunk rkeys from the destination */
	uint64_t	  remote_host_addr;
	uint32_t	  remote_rkey;
};

struct mig_rdma {
	struct rdma_cm_id	*cm_id;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	bool			 is_dest;
	bool			 pin_all;
	bool			 postcopy;
	struct ram_block	*blocks;
	int			 nb_blocks;
	char			 ctrl_tx[RDMA_CTRL_BUF];
	char			 ctrl_rx[RDMA_CTRL_BUF];
	struct ibv_mr		*ctrl_tx_mr;
	struct ibv_mr		*ctrl_rx_mr;
	char			*page_buf;
	struct ibv_mr		*page_mr;
	unsigned		 unsignaled_writes;
	uint64_t		 total_writes;
	uint64_t		 bytes_sent;
	int			 error_state;
};

static int mig_create_qp(struct mig_rdma *rdma)
{
	struct ibv_qp_init_attr attr = { 0 };

	rdma->pd = ibv_alloc_pd(rdma->cm_id->verbs);
	if (!rdma->pd)
		return -1;
	rdma->cq = ibv_create_cq(rdma->cm_id->verbs, RDMA_SEND_DEPTH * 2, NULL, NULL, 0);
	if (!rdma->cq)
		goto err_pd;

	attr.send_cq = rdma->cq;
	attr.recv_cq = rdma->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = RDMA_SEND_DEPTH;
	attr.cap.max_recv_wr = RDMA_CONTROL_RECVS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	/* only requested completions: the write path asks for every 64th */
	attr.sq_sig_all = 0;
	if (rdma_create_qp(rdma->cm_id, rdma->pd, &attr))
		goto err_cq;
	rdma->qp = rdma->cm_id->qp;
	return 0;

err_cq:
	ibv_destroy_cq(rdma->cq);
err_pd:
	ibv_dealloc_pd(rdma->pd);
	return -1;
}

static int mig_reg_control(struct mig_rdma *rdma)
{
	/* OK: rdma-registration-in-datapath -- connection setup; the control MRs live next to the QP */
	rdma->ctrl_tx_mr = rdma_reg_msgs(rdma->cm_id, rdma->ctrl_tx, sizeof(rdma->ctrl_tx));
	if (!rdma->ctrl_tx_mr)
		return -1;
	/* OK: rdma-access-flags-invalid -- rdma_reg_write() includes LOCAL_WRITE */
	rdma->ctrl_rx_mr = rdma_reg_write(rdma->cm_id, rdma->ctrl_rx, sizeof(rdma->ctrl_rx)); /* BUG: rdma-remote-access-overbroad -- a receive buffer only needs LOCAL_WRITE; ctrl_rx_mr->rkey never leaves */
	if (!rdma->ctrl_rx_mr) {
		rdma_dereg_mr(rdma->ctrl_tx_mr);
		return -1;
	}
	if (rdma->is_dest && rdma->postcopy) {
		rdma->page_buf = aligned_alloc(MIG_PAGE, MIG_PAGE * MIG_PAGE_BATCH);
		if (!rdma->page_buf)
			return -1;
		rdma->page_mr = rdma_reg_msgs(rdma->cm_id, rdma->page_buf, MIG_PAGE * MIG_PAGE_BATCH);
		if (!rdma->page_mr)
			return -1;
	}
	return 0;
}

static int mig_reg_whole_ram(struct mig_rdma *rdma)
{
	int i, access;

	if (rdma->is_dest)
		access = IBV_ACCESS_REMOTE_WRITE;
	else
		access = rdma->postcopy ? IBV_ACCESS_REMOTE_READ : 0;

	for (i = 0; i < rdma->nb_blocks; i++) {
		struct ram_block *block = &rdma->blocks[i];

		/* BUG: rdma-access-flags-invalid -- the destination asks for REMOTE_WRITE without LOCAL_WRITE */
		block->mr = ibv_reg_mr(rdma->pd, block->host, block->length, access); /* OK: rdma-remote-access-overbroad, rdma-registration-in-datapath -- rkey shipped in CTRL_RAM_BLOCKS; whole table registered at setup */
		if (!block->mr && errno == ENOTSUP) {
			/* no pinning on this device: fall back to ODP */
			block->mr = ibv_reg_mr(rdma->pd, block->host, block->length,
					       access | IBV_ACCESS_ON_DEMAND); /* BUG: rdma-access-flags-invalid -- same flags, REMOTE_WRITE without LOCAL_WRITE on the destination */
		}
		if (!block->mr) {
			perror("ibv_reg_mr");
			goto unwind;
		}
	}
	return 0;

unwind:
	while (i--) {
		ibv_dereg_mr(rdma->blocks[i].mr);
		rdma->blocks[i].mr = NULL;
	}
	return -1;
}

static int mig_post_recv_control(struct mig_rdma *rdma)
{
	return rdma_post_recv(rdma->cm_id, (void *)(uintptr_t)WRID_RECV_CONTROL,
			      rdma->ctrl_rx, sizeof(rdma->ctrl_rx), rdma->ctrl_rx_mr);
}

/* Poll until a completion carrying @wrid shows up. */
static int mig_block_for_wrid(struct mig_rdma *rdma, uint64_t wrid)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(rdma->cq, 1, &wc);
		if (n < 0)
			return -1;
		if (n == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "wrid %lu: %s\n", (unsigned long)wc.wr_id,
				ibv_wc_status_str(wc.status));
			rdma->error_state = -EIO;
			return -1;
		}
		if (wc.wr_id == wrid)
			return 0;
	}
}

static int mig_exchange_send(struct mig_rdma *rdma, uint32_t type,
			     const void *payload, uint32_t len)
{
	struct mig_ctrl_hdr *hdr = (struct mig_ctrl_hdr *)rdma->ctrl_tx;

	if (len > sizeof(rdma->ctrl_tx) - sizeof(*hdr))
		return -EINVAL;
	hdr->type = type;
	hdr->len = len;
	if (len)
		memcpy(hdr + 1, payload, len);
	/* OK: rdma-unsignaled-send-starvation -- control messages are always signaled and waited for */
	if (rdma_post_send(rdma->cm_id, (void *)(uintptr_t)WRID_SEND_CONTROL, rdma->ctrl_tx,
			   sizeof(*hdr) + len, rdma->ctrl_tx_mr, IBV_SEND_SIGNALED))
		return -1;
	return mig_block_for_wrid(rdma, WRID_SEND_CONTROL);
}

static struct mig_ctrl_hdr *mig_exchange_recv(struct mig_rdma *rdma, uint32_t expect)
{
	struct mig_ctrl_hdr *hdr = (struct mig_ctrl_hdr *)rdma->ctrl_rx;

	if (mig_block_for_wrid(rdma, WRID_RECV_CONTROL))
		return NULL;
	if (expect && hdr->type != expect) {
		fprintf(stderr, "control: got %u, want %u\n", hdr->type, expect);
		return NULL;
	}
	return hdr;
}

/* device model glue: receives the state blob into its own buffer */
int mig_load_device_state(struct mig_rdma *rdma, uint64_t len);

/* Destination: register one chunk the first time the source asks for it. */
static struct ibv_mr *mig_register_chunk(struct mig_rdma *rdma, struct ram_block *block,
					 unsigned chunk)
{
	char *start = block->host + ((uint64_t)chunk << RDMA_CHUNK_SHIFT);
	uint64_t len = RDMA_CHUNK_SIZE;

	if (start + len > block->host + block->length)
		len = block->host + block->length - start;
	if (!block->pmr[chunk])
		/* OK: rdma-registration-in-datapath, rdma-access-flags-invalid, rdma-remote-access-overbroad -- registered on first use and kept in pmr[]; LOCAL_WRITE is there; the rkey goes back in REGISTER_RESULT */
		block->pmr[chunk] = ibv_reg_mr(rdma->pd, start, len,
					       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	return block->pmr[chunk];
}

static int mig_dest_control_loop(struct mig_rdma *rdma)
{
	struct mig_ctrl_hdr *hdr;
	struct mig_reg_req req;
	struct mig_reg_result res;
	struct ibv_mr *mr;

	for (;;) {
		if (mig_post_recv_control(rdma))
			return -1;
		hdr = mig_exchange_recv(rdma, 0);
		if (!hdr)
			return -1;
		switch (hdr->type) {
		case CTRL_REGISTER_REQUEST:
			memcpy(&req, hdr + 1, sizeof(req));
			if (req.block >= (uint32_t)rdma->nb_blocks ||
			    req.chunk >= rdma->blocks[req.block].nb_chunks)
				return -EINVAL;
			mr = mig_register_chunk(rdma, &rdma->blocks[req.block], req.chunk);
			if (!mr)
				return -1;
			res.host_addr = (uintptr_t)mr->addr;
			res.rkey = mr->rkey;
			if (mig_exchange_send(rdma, CTRL_REGISTER_RESULT, &res, sizeof(res)))
				return -1;
			break;
		case CTRL_DEVICE_STATE:
			if (mig_load_device_state(rdma, *(uint64_t *)(hdr + 1)))
				return -1;
			break;
		case CTRL_QUIT:
			return 0;
		default:
			fprintf(stderr, "unexpected control message %u\n", hdr->type);
			return -EINVAL;
		}
	}
}

/* Source: push @len bytes of @block at @off into the destination. */
static int mig_write_one(struct mig_rdma *rdma, int idx, uint64_t off, uint64_t len)
{
	struct ram_block *block = &rdma->blocks[idx];
	unsigned chunk = off >> RDMA_CHUNK_SHIFT;
	struct mig_reg_req req = { .block = idx, .chunk = chunk };
	struct mig_reg_result res;
	struct mig_ctrl_hdr *hdr;
	struct ibv_mr *lmr;
	uint64_t raddr;
	uint32_t rkey;
	int flags = 0;

	if (rdma->pin_all) {
		lmr = block->mr;
		raddr = block->remote_host_addr + off;
		rkey = block->remote_rkey;
	} else {
		if (!block->remote_keys[chunk]) {
			if (mig_post_recv_control(rdma) ||
			    mig_exchange_send(rdma, CTRL_REGISTER_REQUEST, &req, sizeof(req)))
				return -1;
			hdr = mig_exchange_recv(rdma, CTRL_REGISTER_RESULT);
			if (!hdr)
				return -1;
			memcpy(&res, hdr + 1, sizeof(res));
			block->remote_keys[chunk] = res.rkey;
		}
		if (!block->pmr[chunk])
			/* OK: rdma-registration-in-datapath -- source chunk registered once, kept in pmr[] */
			block->pmr[chunk] = ibv_reg_mr(rdma->pd,
				block->host + ((uint64_t)chunk << RDMA_CHUNK_SHIFT),
				RDMA_CHUNK_SIZE, 0);
		lmr = block->pmr[chunk];
		if (!lmr)
			return -1;
		raddr = block->remote_host_addr + off;
		rkey = block->remote_keys[chunk];
	}

	/* BUG(file): rdma-unsignaled-send-starvation -- unsignaled_writes is only ever reset, the write path bumps total_writes instead; writes are never signaled */
	if (rdma->unsignaled_writes >= RDMA_WRITE_SIGNAL_EVERY) {
		flags = IBV_SEND_SIGNALED;
		rdma->unsignaled_writes = 0;
	}
	/* OK: rdma-access-flags-transport -- RDMA WRITE source, local read access is enough on every transport */
	if (rdma_post_write(rdma->cm_id, (void *)(uintptr_t)WRID_RDMA_WRITE,
			    block->host + off, len, lmr, flags, raddr, rkey))
		return -1;
	rdma->total_writes++;
	rdma->bytes_sent += len;
	return 0;
}

/* Source: ship the serialized device state; the buffer changes every call. */
static int mig_send_device_state(struct mig_rdma *rdma, void *state, size_t len)
{
	struct ibv_mr *mr;
	uint64_t len64 = len;
	int ret;

	if (mig_exchange_send(rdma, CTRL_DEVICE_STATE, &len64, sizeof(len64)))
		return -1;
	mr = ibv_reg_mr(rdma->pd, state, len, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-registration-in-datapath -- the caller's state buffer is registered and deregistered on every transfer */
	if (!mr)
		return -1;
	ret = rdma_post_send(rdma->cm_id, (void *)(uintptr_t)WRID_SEND_CONTROL,
			     state, len, mr, IBV_SEND_SIGNALED);
	if (!ret)
		ret = mig_block_for_wrid(rdma, WRID_SEND_CONTROL);
	ibv_dereg_mr(mr);
	return ret;
}

/* Destination, postcopy: pull @npages faulting pages of @block from the source. */
static int mig_fetch_pages(struct mig_rdma *rdma, struct ram_block *block,
			   uint64_t off, unsigned npages)
{
	unsigned i;
	int flags;

	if (npages > MIG_PAGE_BATCH || !block->remote_rkey)
		return -EINVAL;
	for (i = 0; i < npages; i++) {
		uint64_t raddr = block->remote_host_addr + off + i * MIG_PAGE;

		/* OK: rdma-unsignaled-send-starvation -- the last READ of every batch is signaled */
		flags = (i == npages - 1) ? IBV_SEND_SIGNALED : 0;
		if (block->mr) {
			/* OK: rdma-access-flags-transport -- pin-all guest RAM on the destination carries REMOTE_WRITE */
			if (rdma_post_read(rdma->cm_id, (void *)(uintptr_t)WRID_PAGE_READ,
					   block->host + off + i * MIG_PAGE, MIG_PAGE,
					   block->mr, flags, raddr, block->remote_rkey))
				return -1;
			continue;
		}
		/* BUG: rdma-access-flags-transport -- staging page registered with rdma_reg_msgs(): no REMOTE_WRITE, the READ response cannot be placed on iWARP */
		if (rdma_post_read(rdma->cm_id, (void *)(uintptr_t)WRID_PAGE_READ,
				   rdma->page_buf + i * MIG_PAGE, MIG_PAGE,
				   rdma->page_mr, flags, raddr, block->remote_rkey))
			return -1;
	}
	if (mig_block_for_wrid(rdma, WRID_PAGE_READ))
		return -1;
	if (!block->mr)
		memcpy(block->host + off, rdma->page_buf, npages * MIG_PAGE);
	return 0;
}

/* Both sides: swap the block tables; with pin-all, register all RAM first. */
static int mig_exchange_ram_blocks(struct mig_rdma *rdma)
{
	struct mig_block_desc desc[16];
	struct mig_ctrl_hdr *hdr;
	int i, n = rdma->nb_blocks < 16 ? rdma->nb_blocks : 16;

	if (rdma->pin_all && mig_reg_whole_ram(rdma))
		return -1;
	for (i = 0; i < n; i++) {
		desc[i].host_addr = (uintptr_t)rdma->blocks[i].host;
		desc[i].length = rdma->blocks[i].length;
		desc[i].rkey = rdma->pin_all ? rdma->blocks[i].mr->rkey : 0;
	}
	if (mig_post_recv_control(rdma) ||
	    mig_exchange_send(rdma, CTRL_RAM_BLOCKS, desc, n * sizeof(desc[0])))
		return -1;
	hdr = mig_exchange_recv(rdma, CTRL_RAM_BLOCKS);
	if (!hdr)
		return -1;
	memcpy(desc, hdr + 1, n * sizeof(desc[0]));
	for (i = 0; i < n; i++) {
		rdma->blocks[i].remote_host_addr = desc[i].host_addr;
		rdma->blocks[i].remote_rkey = desc[i].rkey;
	}
	return 0;
}

int mig_rdma_setup(struct mig_rdma *rdma, struct rdma_cm_id *connected_id)
{
	rdma->cm_id = connected_id;
	if (mig_create_qp(rdma) || mig_reg_control(rdma))
		return -1;
	return mig_exchange_ram_blocks(rdma);
}

int mig_rdma_save_iteration(struct mig_rdma *rdma, const uint64_t *dirty, int ndirty,
			    void *state, size_t state_len)
{
	int i;

	for (i = 0; i < ndirty; i++) {
		int idx = dirty[i] >> 48;
		uint64_t off = dirty[i] & ((1ULL << 48) - 1);

		if (mig_write_one(rdma, idx, off, RDMA_CHUNK_SIZE))
			return -1;
	}
	if (state && mig_send_device_state(rdma, state, state_len))
		return -1;
	return 0;
}

int mig_rdma_load(struct mig_rdma *rdma)
{
	return mig_dest_control_loop(rdma);
}

int mig_rdma_page_fault(struct mig_rdma *rdma, int idx, uint64_t off, unsigned npages)
{
	return mig_fetch_pages(rdma, &rdma->blocks[idx], off & ~(MIG_PAGE - 1), npages);
}
