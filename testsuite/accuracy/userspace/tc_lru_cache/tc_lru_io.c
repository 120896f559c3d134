/*
 * tc_lru_io.c - blkcache request processing.
 *
 * Requests arrive on a receive ring registered at startup; responses are
 * sent from a response ring.  GET answers with the block's address and its
 * segment's key, PUT pulls the client's buffer with RDMA READ into a cache
 * block (or, for values larger than a block, into a blob that is split into
 * blocks when the read completes), LEASE hands a client the key of its
 * lease mailbox, registered on the client's first LEASE and kept.
 *
 * The response ring is registered with remote read nobody is told about,
 * the large-PUT path registers its landing blob per request and leaks it
 * when the READ cannot be posted.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "tc_lru.h"

#define LRU_RX_DEPTH		256
#define LRU_IO_DEPTH		128
#define LRU_MAX_CLIENTS		64
#define LRU_MAILBOX_SIZE	4096
#define LRU_RX_TAG		(1ULL << 62)

struct lru_op {
	struct lru_op	*next;
	struct lru_req	req;
	struct lru_seg	*seg;
	char		*block;
	void		*blob;
	struct ibv_mr	*blob_mr;
};

struct lru_io_ctx {
	struct lru_srv	*srv;
	char		*rx_ring;
	struct ibv_mr	*rx_mr;
	struct lru_resp	*resp_ring;
	struct ibv_mr	*resp_mr;
	unsigned int	resp_next;
	struct lru_op	ops[LRU_IO_DEPTH];
	struct lru_op	*free_ops;
	void		*mailbox[LRU_MAX_CLIENTS];
	struct ibv_mr	*mailbox_mr[LRU_MAX_CLIENTS];
};

static struct lru_op *lru_op_get(struct lru_io_ctx *io)
{
	struct lru_op *op = io->free_ops;

	if (op) {
		io->free_ops = op->next;
		memset(op, 0, sizeof(*op));
	}
	return op;
}

static void lru_op_put(struct lru_io_ctx *io, struct lru_op *op)
{
	op->next = io->free_ops;
	io->free_ops = op;
}

static int lru_post_rx(struct lru_io_ctx *io, unsigned int idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(io->rx_ring + (size_t)idx * sizeof(struct lru_req)),
		.length = sizeof(struct lru_req),
		.lkey = io->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = LRU_RX_TAG | idx, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(io->srv->qp, &wr, &bad);
}

static int lru_respond(struct lru_io_ctx *io, uint8_t status, uint32_t rkey,
		       const void *addr, uint32_t len, uint32_t tag)
{
	struct lru_resp *resp = &io->resp_ring[io->resp_next++ % LRU_IO_DEPTH];
	struct ibv_sge sge = {
		.addr = (uintptr_t)resp,
		.length = sizeof(*resp),
		.lkey = io->resp_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad;

	resp->status = status;
	resp->rkey = htobe32(rkey);
	resp->addr = htobe64((uintptr_t)addr);
	resp->len = htobe32(len);
	resp->tag = tag;
	return ibv_post_send(io->srv->qp, &wr, &bad);
}

struct lru_io_ctx *lru_io_create(struct lru_srv *srv)
{
	struct lru_io_ctx *io;
	unsigned int i;

	io = calloc(1, sizeof(*io));
	if (!io)
		return NULL;
	io->srv = srv;
	for (i = 0; i < LRU_IO_DEPTH; i++)
		lru_op_put(io, &io->ops[i]);

	io->rx_ring = calloc(LRU_RX_DEPTH, sizeof(struct lru_req));
	io->resp_ring = calloc(LRU_IO_DEPTH, sizeof(struct lru_resp));
	if (!io->rx_ring || !io->resp_ring)
		goto err_mem;
	/* OK: rdma-local-mr-management -- receive ring registered once, local access */
	io->rx_mr = ibv_reg_mr(srv->pd, io->rx_ring, LRU_RX_DEPTH * sizeof(struct lru_req),
			       IBV_ACCESS_LOCAL_WRITE);
	if (!io->rx_mr)
		goto err_mem;
	/* clients that lost a response can fetch it again from its slot */
	/* OK: rdma-local-mr-management -- registered once; only its lkey addresses the response SENDs */
	io->resp_mr = ibv_reg_mr(srv->pd, io->resp_ring, LRU_IO_DEPTH * sizeof(struct lru_resp), // BUG: rdma-remote-access-overbroad -- remote read on the response ring, whose rkey is never sent to a client
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!io->resp_mr)
		goto err_rx_mr;

	for (i = 0; i < LRU_RX_DEPTH; i++)
		if (lru_post_rx(io, i))
			goto err_resp_mr;
	return io;

err_resp_mr:
	ibv_dereg_mr(io->resp_mr);
err_rx_mr:
	ibv_dereg_mr(io->rx_mr); // OK: rdma-mr-leak -- both rings are deregistered on the way out
err_mem:
	free(io->resp_ring);
	free(io->rx_ring);
	free(io);
	return NULL;
}

static int lru_handle_get(struct lru_io_ctx *io, struct lru_op *op)
{
	uint64_t key = be64toh(op->req.key);
	struct lru_seg *seg;
	char *block;

	seg = lru_block_lookup(io->srv, key, &block);
	if (!seg)
		return lru_respond(io, LRU_ST_MISS, 0, NULL, 0, op->req.tag);
	seg->readers++;
	return lru_respond(io, LRU_ST_OK, seg->mr->rkey, block, LRU_BLOCK_SIZE, op->req.tag);
}

static int lru_handle_put(struct lru_io_ctx *io, struct lru_op *op)
{
	uint32_t len = be32toh(op->req.len);
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	if (len <= LRU_BLOCK_SIZE) {
		op->block = lru_block_alloc(io->srv, &op->seg);
		if (!op->block)
			return lru_respond(io, LRU_ST_NOSPC, 0, NULL, 0, op->req.tag);
		sge.addr = (uintptr_t)op->block;
		sge.lkey = op->seg->mr->lkey;
	} else {
		op->blob = lru_blob_alloc(len);
		if (!op->blob)
			return lru_respond(io, LRU_ST_NOSPC, 0, NULL, 0, op->req.tag);
		/* BUG: rdma-local-mr-management -- per-request registration whose lkey is the sink of the server's RDMA READ */
		op->blob_mr = ibv_reg_mr(io->srv->pd, op->blob, len, // BUG: rdma-registration-in-datapath -- every large PUT registers its landing blob
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // OK: rdma-remote-access-overbroad -- remote write is for the iWARP read sink
		if (!op->blob_mr) {
			free(op->blob);
			return lru_respond(io, LRU_ST_NOSPC, 0, NULL, 0, op->req.tag);
		}
		sge.addr = (uintptr_t)op->blob;
		sge.lkey = op->blob_mr->lkey;
	}
	sge.length = len;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)op;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = be64toh(op->req.addr);
	wr.wr.rdma.rkey = be32toh(op->req.rkey);
	if (ibv_post_send(io->srv->qp, &wr, &bad)) {
		free(op->blob);
		lru_respond(io, LRU_ST_IO, 0, NULL, 0, op->req.tag);
		return -EIO; // BUG: rdma-mr-leak -- the blob's registration stays in op->blob_mr and is never deregistered
	}
	return 0;
}

static int lru_handle_lease(struct lru_io_ctx *io, struct lru_op *op)
{
	unsigned int cid = op->req.client % LRU_MAX_CLIENTS;

	if (!io->mailbox_mr[cid]) {
		io->mailbox[cid] = calloc(1, LRU_MAILBOX_SIZE);
		if (!io->mailbox[cid])
			return lru_respond(io, LRU_ST_NOSPC, 0, NULL, 0, op->req.tag);
		/* BUG: rdma-local-mr-management -- the mailbox's rkey goes to the client in the LEASE response */
		io->mailbox_mr[cid] = ibv_reg_mr(io->srv->pd, io->mailbox[cid], LRU_MAILBOX_SIZE, IBV_ACCESS_REMOTE_READ); // OK: rdma-registration-in-datapath, rdma-remote-access-overbroad -- registered on the client's first lease and kept; the client reads it with the key it is sent
		if (!io->mailbox_mr[cid]) {
			free(io->mailbox[cid]);
			io->mailbox[cid] = NULL;
			return lru_respond(io, LRU_ST_NOSPC, 0, NULL, 0, op->req.tag);
		}
	}
	return lru_respond(io, LRU_ST_OK, io->mailbox_mr[cid]->rkey, io->mailbox[cid],
			   LRU_MAILBOX_SIZE, op->req.tag);
}

static void lru_io_complete(struct lru_io_ctx *io, struct ibv_wc *wc)
{
	struct lru_op *op = (struct lru_op *)(uintptr_t)wc->wr_id;
	uint64_t key = be64toh(op->req.key);

	if (op->blob_mr) {
		ibv_dereg_mr(op->blob_mr); // BUG: rdma-registration-in-datapath -- the per-request registration is torn down in the completion
		op->blob_mr = NULL;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		free(op->blob);
		lru_respond(io, LRU_ST_IO, 0, NULL, 0, op->req.tag);
	} else if (op->blob) {
		lru_blob_insert(io->srv, key, op->blob, be32toh(op->req.len));
		lru_respond(io, LRU_ST_OK, 0, NULL, 0, op->req.tag);
	} else {
		lru_block_index(io->srv, key, op->seg, op->block);
		lru_respond(io, LRU_ST_OK, 0, NULL, 0, op->req.tag);
	}
	lru_op_put(io, op);
}

int lru_io_poll(struct lru_io_ctx *io)
{
	struct ibv_wc wc[32];
	struct lru_op *op;
	unsigned int idx;
	int n, i;

	n = ibv_poll_cq(io->srv->cq, 32, wc);
	for (i = 0; i < n; i++) {
		if (!(wc[i].wr_id & LRU_RX_TAG)) {
			if (wc[i].wr_id)
				lru_io_complete(io, &wc[i]);
			continue;
		}
		idx = wc[i].wr_id & 0xffff;
		if (wc[i].status != IBV_WC_SUCCESS)
			continue;
		op = lru_op_get(io);
		if (op) {
			memcpy(&op->req, io->rx_ring + (size_t)idx * sizeof(struct lru_req), sizeof(op->req));
			switch (op->req.op) {
			case LRU_OP_GET:
				lru_handle_get(io, op);
				lru_op_put(io, op);
				break;
			case LRU_OP_PUT:
				if (lru_handle_put(io, op))
					lru_op_put(io, op);
				break;
			case LRU_OP_LEASE:
				lru_handle_lease(io, op);
				lru_op_put(io, op);
				break;
			default:
				lru_op_put(io, op);
			}
		}
		lru_post_rx(io, idx);
	}
	return n;
}

void lru_io_destroy(struct lru_io_ctx *io)
{
	unsigned int i;

	for (i = 0; i < LRU_MAX_CLIENTS; i++) {
		if (io->mailbox_mr[i])
			ibv_dereg_mr(io->mailbox_mr[i]);
		free(io->mailbox[i]);
	}
	ibv_dereg_mr(io->resp_mr);
	ibv_dereg_mr(io->rx_mr);
	free(io->resp_ring);
	free(io->rx_ring);
	free(io);
}
