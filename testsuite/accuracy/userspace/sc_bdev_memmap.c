/*
 * sc_bdev_memmap.c - "rbd": block device initiator over RDMA verbs, in the
 * style of an SPDK bdev module.
 *
 * Data buffers come from a DMA-safe pool that is registered once, region by
 * region, into a memory map; each I/O translates its buffer through the map
 * and sends the region's rkey in a keyed SGL command so that the target can
 * RDMA READ/WRITE the payload. Buffers that are not in the map (a caller that
 * did not use the pool) are registered on the fly, which is slow. The
 * channel also pulls the target's log page with an RDMA READ into a local
 * buffer, and gives the target a metadata (PI) buffer to write into.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-rkey-reuse,
 *   rdma-send-queue-undersized, rdma-send-queue-manual-factor,
 *   rdma-unsignaled-send-starvation, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked -- not reviewed for this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define RBD_MAP_SLOTS    64
#define RBD_QUEUE_DEPTH  512
#define RBD_MAX_SGE      16
#define RBD_INLINE       128
#define RBD_LOG_LEN      4096
#define RBD_META_LEN     (RBD_QUEUE_DEPTH * 64)

#define RBD_OPC_READ   0x02
#define RBD_OPC_WRITE  0x01

enum rbd_role { RBD_ROLE_CMD, RBD_ROLE_DATA, RBD_ROLE_META };

struct rbd_region { uintptr_t vaddr; size_t len; struct ibv_mr *mr; };

struct rbd_mem_map {
	struct ibv_pd     *pd;
	int                nregions;
	struct rbd_region  regions[RBD_MAP_SLOTS];
};

struct rbd_cmd {			/* 32-byte keyed-SGL command */
	uint8_t  opc, flags;
	uint16_t cid;
	uint32_t nsid;
	uint64_t slba;
	uint32_t nlb, key;
	uint64_t addr;
	uint32_t len, rsvd;
};

struct rbd_rsp   { uint16_t cid, status; uint32_t rsvd; };
struct rbd_hello { uint64_t meta_addr; uint32_t meta_rkey, qdepth; };

struct rbd_channel;

struct rbd_io {
	struct rbd_channel *ch;
	uint16_t            cid;
	void               *buf;
	size_t              len;
	uint64_t            slba;
	int                 write;
	struct ibv_mr      *bounce_mr;
	void              (*cb)(struct rbd_io *io, int status);
	struct rbd_io      *next_free;
};

struct rbd_channel {
	struct ibv_context     *ctx;
	struct ibv_pd          *pd;
	struct ibv_cq          *cq;
	struct ibv_qp          *qp;
	enum ibv_transport_type transport;
	uint32_t                max_read_sge;
	uint32_t                max_inline;
	struct rbd_mem_map     *map;
	struct rbd_cmd         *cmds;	struct ibv_mr *cmd_mr;
	struct rbd_rsp         *rsps;	struct ibv_mr *rsp_mr;
	void                   *meta;	struct ibv_mr *meta_mr;
	void                   *log;	struct ibv_mr *log_mr;
	struct rbd_io           ios[RBD_QUEUE_DEPTH];
	struct rbd_io          *free_ios;
};

static int rbd_role_access(enum rbd_role role)
{
	switch (role) {
	case RBD_ROLE_DATA:
		return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		       IBV_ACCESS_REMOTE_WRITE;
	case RBD_ROLE_META:
		/* the target only ever writes protection info into it */
		return IBV_ACCESS_REMOTE_WRITE;
	case RBD_ROLE_CMD:
	default:
		return IBV_ACCESS_LOCAL_WRITE;
	}
}

/* Register every pool region once, at pool creation. */
struct rbd_mem_map *rbd_mem_map_create(struct ibv_pd *pd, void **bufs,
				       const size_t *lens, int n)
{
	struct rbd_mem_map *map;
	int i;

	if (n > RBD_MAP_SLOTS)
		return NULL;
	map = calloc(1, sizeof(*map));
	if (!map)
		return NULL;
	map->pd = pd;

	for (i = 0; i < n; i++) {
		struct rbd_region *r = &map->regions[i];

		r->vaddr = (uintptr_t)bufs[i];
		r->len = lens[i];
		/* OK: rdma-access-flags-invalid -- the data role includes LOCAL_WRITE */
		r->mr = ibv_reg_mr(pd, bufs[i], lens[i], rbd_role_access(RBD_ROLE_DATA)); /* BUG: rdma-local-mr-management -- the region's rkey is sent to the target in every keyed SGL */
		if (!r->mr)
			goto unwind;
	}
	map->nregions = n;
	return map;

unwind:
	while (i--)
		ibv_dereg_mr(map->regions[i].mr);
	free(map);
	return NULL; /* OK: rdma-mr-leak -- every region registered so far was released above */
}

void rbd_mem_map_destroy(struct rbd_mem_map *map)
{
	int i;

	for (i = 0; i < map->nregions; i++)
		ibv_dereg_mr(map->regions[i].mr);
	free(map);
}

static struct rbd_region *rbd_mem_map_translate(struct rbd_mem_map *map,
						void *buf, size_t len)
{
	uintptr_t a = (uintptr_t)buf;
	int i;

	for (i = 0; i < map->nregions; i++) {
		struct rbd_region *r = &map->regions[i];

		if (a >= r->vaddr && a + len <= r->vaddr + r->len)
			return r;
	}
	return NULL;
}

/* Slow path: the caller's buffer is not from the DMA pool. */
static struct ibv_mr *rbd_bounce_reg(struct rbd_channel *ch, struct rbd_io *io)
{
	int access = IBV_ACCESS_LOCAL_WRITE |
		     (io->write ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE);

	/* OK: rdma-remote-access-overbroad -- the rkey goes to the target in the command */
	return ibv_reg_mr(ch->pd, io->buf, io->len, access); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- registers the caller's buffer for every I/O that misses the map */
}

int rbd_submit(struct rbd_channel *ch, struct rbd_io *io)
{
	struct rbd_cmd *cmd = &ch->cmds[io->cid];
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge sge;
	struct rbd_region *r;
	uint32_t rkey;

	r = rbd_mem_map_translate(ch->map, io->buf, io->len); /* OK: rdma-registration-in-datapath -- pool buffers are looked up, not registered */
	if (r) {
		rkey = r->mr->rkey;
	} else {
		io->bounce_mr = rbd_bounce_reg(ch, io);
		if (!io->bounce_mr)
			return -ENOMEM;
		rkey = io->bounce_mr->rkey;
	}

	memset(cmd, 0, sizeof(*cmd));
	cmd->opc = io->write ? RBD_OPC_WRITE : RBD_OPC_READ;
	cmd->cid = htole16(io->cid);
	cmd->slba = htole64(io->slba);
	cmd->nlb = htole32((uint32_t)(io->len >> 9) - 1);
	cmd->key = htole32(rkey);
	cmd->addr = htole64((uintptr_t)io->buf);
	cmd->len = htole32((uint32_t)io->len);

	sge.addr = (uintptr_t)cmd;
	sge.length = sizeof(*cmd);
	sge.lkey = ch->cmd_mr->lkey;
	wr.wr_id = (uintptr_t)io;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;

	if (ibv_post_send(ch->qp, &wr, &bad)) {
		fprintf(stderr, "rbd: post cid %u failed: %s\n", io->cid, strerror(errno));
		return -errno; /* BUG: rdma-mr-leak -- a bounce registration made above stays in io->bounce_mr and the io goes back to the caller as failed */
	}
	return 0;
}

static void rbd_process_rsp(struct rbd_channel *ch, struct ibv_wc *wc)
{
	struct rbd_rsp *rsp = &ch->rsps[wc->wr_id];
	struct ibv_recv_wr rwr = {0}, *bad;
	struct ibv_sge sge;
	struct rbd_io *io;

	io = &ch->ios[le16toh(rsp->cid) % RBD_QUEUE_DEPTH];
	if (io->bounce_mr) {
		ibv_dereg_mr(io->bounce_mr); /* BUG: rdma-registration-in-datapath -- per-I/O deregistration in the completion handler */
		io->bounce_mr = NULL;
	}
	io->cb(io, wc->status == IBV_WC_SUCCESS ? le16toh(rsp->status) : -EIO);
	io->next_free = ch->free_ios;
	ch->free_ios = io;

	sge.addr = (uintptr_t)rsp;
	sge.length = sizeof(*rsp);
	sge.lkey = ch->rsp_mr->lkey;
	rwr.wr_id = wc->wr_id;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	ibv_post_recv(ch->qp, &rwr, &bad);
}

int rbd_poll(struct rbd_channel *ch, int budget)
{
	struct ibv_wc wc[16];
	int n, i, done = 0;

	while (done < budget) {
		n = ibv_poll_cq(ch->cq, 16, wc);
		if (n <= 0)
			break;
		for (i = 0; i < n; i++)
			if (wc[i].opcode == IBV_WC_RECV)
				rbd_process_rsp(ch, &wc[i]);
		done += n;
	}
	return done;
}

/* Pull the target's log page (address and key came in its accept data). */
int rbd_fetch_log(struct rbd_channel *ch, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge sge = {
		.addr = (uintptr_t)ch->log,
		.length = RBD_LOG_LEN,
		.lkey = ch->log_mr->lkey,
	};

	wr.wr_id = UINT64_MAX;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(ch->qp, &wr, &bad) ? -errno : 0; /* BUG: rdma-access-flags-transport -- the log buffer is a READ sink registered without REMOTE_WRITE; fails on iWARP */
}

void rbd_build_hello(struct rbd_channel *ch, struct rbd_hello *h)
{
	h->meta_addr = htobe64((uintptr_t)ch->meta);
	h->meta_rkey = htobe32(ch->meta_mr->rkey);
	h->qdepth = htobe32(RBD_QUEUE_DEPTH);
}

struct rbd_channel *rbd_channel_create(struct ibv_context *ctx, struct ibv_pd *pd,
				       struct rbd_mem_map *map)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr init = {0};
	struct rbd_channel *ch;
	int i;

	if (ibv_query_device(ctx, &dattr))
		return NULL;
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->ctx = ctx;
	ch->pd = pd;
	ch->map = map;
	ch->transport = ctx->device->transport_type;
	if (ch->transport == IBV_TRANSPORT_IWARP) /* OK: rdma-access-flags-transport -- the transport only sizes the READ scatter list */
		ch->max_read_sge = 1;
	else
		ch->max_read_sge = RBD_MAX_SGE;

	ch->cmds = calloc(RBD_QUEUE_DEPTH, sizeof(*ch->cmds));
	ch->rsps = calloc(RBD_QUEUE_DEPTH, sizeof(*ch->rsps));
	ch->meta = calloc(1, RBD_META_LEN);
	ch->log = calloc(1, RBD_LOG_LEN);
	if (!ch->cmds || !ch->rsps || !ch->meta || !ch->log)
		goto err_free;

	ch->cmd_mr = ibv_reg_mr(pd, ch->cmds, RBD_QUEUE_DEPTH * sizeof(*ch->cmds),
				IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- command ring, registered once and used only as a SEND source */
	if (!ch->cmd_mr)
		goto err_free;
	/* BUG: rdma-remote-access-overbroad -- the response ring's rkey is never given to the target; it only receives SENDs */
	ch->rsp_mr = ibv_reg_mr(pd, ch->rsps, RBD_QUEUE_DEPTH * sizeof(*ch->rsps),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-local-mr-management -- receive ring registered once at setup */
	if (!ch->rsp_mr)
		goto err_cmd;
	/* OK: rdma-remote-access-overbroad -- the meta rkey goes to the target in the hello */
	ch->meta_mr = ibv_reg_mr(pd, ch->meta, RBD_META_LEN, rbd_role_access(RBD_ROLE_META)); /* BUG: rdma-access-flags-invalid, rdma-local-mr-management -- REMOTE_WRITE without LOCAL_WRITE; and the key is exposed to the target */
	if (!ch->meta_mr)
		goto err_rsp;
	ch->log_mr = ibv_reg_mr(pd, ch->log, RBD_LOG_LEN, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- sink of the channel's own RDMA READ */
	if (!ch->log_mr)
		goto err_meta;

	ch->cq = ibv_create_cq(ctx, RBD_QUEUE_DEPTH * 3, ch, NULL, 0);
	if (!ch->cq)
		goto err_meta; /* BUG: rdma-mr-leak -- jumps past err_log, log_mr is never deregistered */

	init.send_cq = ch->cq;
	init.recv_cq = ch->cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = RBD_QUEUE_DEPTH * 2 < dattr.max_qp_wr ?
			       RBD_QUEUE_DEPTH * 2 : dattr.max_qp_wr; /* OK: rdma-queue-cap-unchecked -- clamped to max_qp_wr */
	init.cap.max_recv_wr = RBD_QUEUE_DEPTH;
	init.cap.max_send_sge = RBD_MAX_SGE; /* BUG: rdma-queue-cap-unchecked -- 16 SGEs never compared with dattr.max_sge */
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = RBD_INLINE; /* OK: rdma-queue-cap-unchecked -- the granted inline size is read back below */
	ch->qp = ibv_create_qp(pd, &init);
	if (!ch->qp)
		goto err_cq;
	ch->max_inline = init.cap.max_inline_data;

	for (i = 0; i < RBD_QUEUE_DEPTH; i++) {
		ch->ios[i].ch = ch;
		ch->ios[i].cid = (uint16_t)i;
		ch->ios[i].next_free = ch->free_ios;
		ch->free_ios = &ch->ios[i];
	}
	return ch;

err_cq:
	ibv_destroy_cq(ch->cq);
err_log:
	ibv_dereg_mr(ch->log_mr);
err_meta:
	ibv_dereg_mr(ch->meta_mr);
err_rsp:
	ibv_dereg_mr(ch->rsp_mr);
err_cmd:
	ibv_dereg_mr(ch->cmd_mr);
err_free:
	free(ch->log);
	free(ch->meta);
	free(ch->rsps);
	free(ch->cmds);
	free(ch);
	return NULL;
}

void rbd_channel_destroy(struct rbd_channel *ch)
{
	ibv_destroy_qp(ch->qp);
	ibv_destroy_cq(ch->cq);
	ibv_dereg_mr(ch->log_mr);
	ibv_dereg_mr(ch->meta_mr);
	ibv_dereg_mr(ch->rsp_mr);
	ibv_dereg_mr(ch->cmd_mr);
	free(ch->log);
	free(ch->meta);
	free(ch->rsps);
	free(ch->cmds);
	free(ch);
}
