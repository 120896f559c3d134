/*
 * vb_xqp_stream.c - one-sided streaming benchmark in the perftest mould.
 *
 * The source pushes chunks into the sink's ring with RDMA WRITEs posted
 * through the extended verbs API (ibv_qp_ex, ibv_wr_start/ibv_wr_complete):
 * XS_NSEG writes per chunk followed by a SEND_WITH_IMM carrying the chunk
 * number.  Completions are requested every XS_CQ_MOD chunks.  A second,
 * classic QP carries the control messages (sq_sig_all = 1).  Process-wide
 * handles are statics, as in perftest.
 *
 * Handshake: the source tells the sink the rkey of its ring (the sink reads
 * it back in --verify mode) and of the completion counter the sink bumps
 * with fetch-and-add.
 *
 * Known problems: the data QP asks for 2048 WRs and 8 SGEs without looking
 * at the device, and reserves 2 entries per chunk where a chunk posts 5;
 * the signaling counter is never advanced; the counter MR asks for remote
 * atomics without local write; the staging buffer is re-registered without
 * dropping the old MR, and grants remote read nobody learns about; a user
 * push registers and deregisters its buffer on every call.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-access-flags-transport, rdma-send-queue-manual-factor, rdma-rkey-reuse, rdma-remote-invalidate-unchecked -- not the subject of this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define XS_NSEG			4
#define XS_SEG_SIZE		(64 * 1024)
#define XS_CHUNK_SIZE		(XS_NSEG * XS_SEG_SIZE)
#define XS_RING_CHUNKS		64
#define XS_MAX_INFLIGHT		1024
#define XS_TX_DEPTH		(XS_MAX_INFLIGHT * 2)
#define XS_MAX_SGE		8
#define XS_CQ_MOD		32
#define XS_CTL_RX_DEPTH		2048
#define XS_CTL_MSG		64
#define XS_RCACHE_SIZE		16

#define XS_WRID_CHUNK		1
#define XS_WRID_USER		2

struct xs_remote {
	uint64_t addr;
	uint32_t rkey;
	uint32_t cnt_rkey;
	uint64_t cnt_addr;
};

static struct ibv_context *g_ctx;
static struct ibv_pd *g_pd;
static struct ibv_cq *g_cq;
static struct ibv_qp *g_qp;
static struct ibv_qp_ex *g_qpx;
static struct ibv_qp *g_ctl_qp;

static char *g_ring;
static struct ibv_mr *g_ring_mr;
static uint64_t *g_cnt;
static struct ibv_mr *g_cnt_mr;
static char *g_stage;
static size_t g_stage_len;
static struct ibv_mr *g_stage_mr;
static char *g_ctl_buf;
static struct ibv_mr *g_ctl_mr;

static struct xs_remote g_remote;
static unsigned int g_unsig;
static unsigned int g_inflight;
static unsigned long g_posted_total;

static struct {
	void *addr;
	size_t len;
	struct ibv_mr *mr;
} g_rcache[XS_RCACHE_SIZE];
static unsigned int g_rcache_next;

static int xs_create_data_qp(void)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = g_cq;
	attr.recv_cq = g_cq;
	attr.qp_type = IBV_QPT_RC;
	attr.pd = g_pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM;
	/* BUG(file): rdma-send-queue-undersized -- XS_MAX_INFLIGHT chunks in flight, each posts XS_NSEG writes and a SEND: 5 entries, 2 reserved */
	attr.cap.max_send_wr = XS_TX_DEPTH;	// BUG: rdma-queue-cap-unchecked -- 2048 is never compared with max_qp_wr
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = XS_MAX_SGE;	// BUG: rdma-queue-cap-unchecked -- 8 SGEs without looking at max_sge
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 0;

	g_qp = ibv_create_qp_ex(g_ctx, &attr);
	if (!g_qp)
		return -errno;
	g_qpx = ibv_qp_to_qp_ex(g_qp);
	return 0;
}

static int xs_create_ctl_qp(void)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(g_ctx, &dattr))
		return -errno;
	if ((int)XS_CTL_RX_DEPTH > dattr.max_qp_wr) {
		fprintf(stderr, "device supports only %d WRs per queue\n", dattr.max_qp_wr);
		return -EINVAL;
	}

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = g_cq;
	attr.recv_cq = g_cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 1;
	attr.cap.max_send_wr = 64;
	attr.cap.max_recv_wr = XS_CTL_RX_DEPTH;	// OK: rdma-queue-cap-unchecked -- compared with dattr.max_qp_wr above
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	g_ctl_qp = ibv_create_qp(g_pd, &attr);
	return g_ctl_qp ? 0 : -errno;
}

static int xs_reg_buffers(void)
{
	g_ring = aligned_alloc(4096, (size_t)XS_RING_CHUNKS * XS_CHUNK_SIZE);
	g_cnt = aligned_alloc(64, 64);
	g_ctl_buf = calloc(XS_CTL_RX_DEPTH + 1, XS_CTL_MSG);
	if (!g_ring || !g_cnt || !g_ctl_buf)
		return -ENOMEM;
	memset(g_cnt, 0, 64);

	/* source of the writes; the sink may read it back to verify */
	/* OK: rdma-registration-in-datapath -- set up once before the run loop, kept in a global */
	g_ring_mr = ibv_reg_mr(g_pd, g_ring, (size_t)XS_RING_CHUNKS * XS_CHUNK_SIZE,
			       IBV_ACCESS_REMOTE_READ);	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- remote read needs no local write; the rkey goes to the sink in xs_handshake()
	if (!g_ring_mr)
		return -errno;
	g_cnt_mr = ibv_reg_mr(g_pd, g_cnt, 64,
			      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ);	// BUG: rdma-access-flags-invalid -- remote atomic requires IBV_ACCESS_LOCAL_WRITE
	if (!g_cnt_mr)
		return -errno;	// OK: rdma-mr-leak -- g_ring_mr stays in its global; xs_run() tears every global down on failure
	g_ctl_mr = ibv_reg_mr(g_pd, g_ctl_buf, (XS_CTL_RX_DEPTH + 1) * XS_CTL_MSG,
			      IBV_ACCESS_LOCAL_WRITE);
	if (!g_ctl_mr)
		return -errno;
	return 0;
}

/* staging for unaligned payloads; grows with the largest message seen */
static int xs_grow_stage(size_t want)
{
	struct ibv_mr *nmr;
	char *nbuf;

	if (want <= g_stage_len)
		return 0;
	nbuf = aligned_alloc(4096, want);
	if (!nbuf)
		return -ENOMEM;
	/* OK: rdma-registration-in-datapath -- grows only past the largest size seen; the MR is kept in g_stage_mr */
	nmr = ibv_reg_mr(g_pd, nbuf, want,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);	// BUG: rdma-remote-access-overbroad -- only g_stage_mr->lkey is used, the rkey never leaves
	if (!nmr) {
		free(nbuf);
		return -errno;
	}
	free(g_stage);
	g_stage = nbuf;
	g_stage_len = want;
	g_stage_mr = nmr;	// BUG: rdma-mr-leak -- the previous staging MR is dropped without ibv_dereg_mr
	return 0;
}

/* after a control-channel reset the control ring is re-registered */
static int xs_ctl_rearm(void)
{
	if (g_ctl_mr)
		ibv_dereg_mr(g_ctl_mr);
	memset(g_ctl_buf, 0, (XS_CTL_RX_DEPTH + 1) * XS_CTL_MSG);
	/* OK: rdma-registration-in-datapath -- only after a control-channel reset, into the global */
	g_ctl_mr = ibv_reg_mr(g_pd, g_ctl_buf, (XS_CTL_RX_DEPTH + 1) * XS_CTL_MSG,
			      IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-mr-leak -- the old control MR was deregistered first
	return g_ctl_mr ? 0 : -errno;
}

static int xs_handshake(int sock)
{
	struct xs_remote mine, peer;

	mine.addr = htobe64((uintptr_t)g_ring);
	mine.rkey = htobe32(g_ring_mr->rkey);
	mine.cnt_addr = htobe64((uintptr_t)g_cnt);
	mine.cnt_rkey = htobe32(g_cnt_mr->rkey);
	if (write(sock, &mine, sizeof(mine)) != sizeof(mine) ||
	    read(sock, &peer, sizeof(peer)) != sizeof(peer))
		return -EIO;
	g_remote.addr = be64toh(peer.addr);
	g_remote.rkey = be32toh(peer.rkey);
	return 0;
}

static int xs_reap(int min)
{
	struct ibv_wc wc[16];
	int n, i, got = 0;

	do {
		n = ibv_poll_cq(g_cq, 16, wc);
		if (n < 0)
			return -EIO;
		for (i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				return -EIO;
			if (wc[i].wr_id == XS_WRID_CHUNK)
				g_inflight -= g_inflight < XS_CQ_MOD ? g_inflight : XS_CQ_MOD;
		}
		got += n;
	} while (got < min);
	return got;
}

static int xs_post_chunk(uint64_t chunk)
{
	uint64_t slot = chunk % XS_RING_CHUNKS;
	char *src = g_ring + slot * XS_CHUNK_SIZE;
	int i;

	while (g_inflight >= XS_MAX_INFLIGHT)
		if (xs_reap(1) < 0)
			return -EIO;

	ibv_wr_start(g_qpx);
	for (i = 0; i < XS_NSEG; i++) {
		uint64_t off = slot * XS_CHUNK_SIZE + (uint64_t)i * XS_SEG_SIZE;

		g_qpx->wr_id = 0;
		g_qpx->wr_flags = 0;
		ibv_wr_rdma_write(g_qpx, g_remote.rkey, g_remote.addr + off);
		ibv_wr_set_sge(g_qpx, g_ring_mr->lkey, (uintptr_t)(src + (size_t)i * XS_SEG_SIZE),
			       XS_SEG_SIZE);
	}

	g_qpx->wr_id = XS_WRID_CHUNK;
	if (g_unsig >= XS_CQ_MOD - 1) {
		g_qpx->wr_flags = IBV_SEND_SIGNALED;	// BUG(file): rdma-unsignaled-send-starvation -- g_unsig is only ever reset; nothing increments it, so no chunk is ever signaled
		g_unsig = 0;
	} else {
		g_qpx->wr_flags = 0;
	}
	ibv_wr_send_imm(g_qpx, htobe32((uint32_t)chunk));
	ibv_wr_set_sge_list(g_qpx, 0, NULL);

	if (ibv_wr_complete(g_qpx))
		return -EIO;
	g_inflight++;
	g_posted_total += XS_NSEG + 1;
	return 0;
}

static int xs_wait_user(void)
{
	return xs_reap(1) < 0 ? -EIO : 0;
}

/* push an arbitrary user buffer, registering it for the duration */
int xs_push_user(void *ubuf, size_t len, uint64_t raddr)
{
	struct ibv_mr *umr;
	int ret;

	umr = ibv_reg_mr(g_pd, ubuf, len, IBV_ACCESS_LOCAL_WRITE);	// BUG: rdma-registration-in-datapath -- the caller's buffer is registered on every push
	if (!umr)
		return -errno;

	ibv_wr_start(g_qpx);
	g_qpx->wr_id = XS_WRID_USER;
	g_qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(g_qpx, g_remote.rkey, raddr);
	ibv_wr_set_sge(g_qpx, umr->lkey, (uintptr_t)ubuf, (uint32_t)len);
	ret = ibv_wr_complete(g_qpx);
	if (!ret)
		ret = xs_wait_user();
	ibv_dereg_mr(umr);	// BUG: rdma-registration-in-datapath -- and deregistered on every push
	return ret;
}

static struct ibv_mr *xs_rcache_get(void *addr, size_t len)
{
	unsigned int i;
	int slot;

	for (i = 0; i < XS_RCACHE_SIZE; i++) {
		if (g_rcache[i].mr && g_rcache[i].addr == addr && g_rcache[i].len >= len)
			return g_rcache[i].mr;
	}
	slot = g_rcache_next++ % XS_RCACHE_SIZE;
	if (g_rcache[slot].mr)
		ibv_dereg_mr(g_rcache[slot].mr);	// OK: rdma-registration-in-datapath -- evicts a cache victim on a miss only
	g_rcache[slot].addr = addr;
	g_rcache[slot].len = len;
	g_rcache[slot].mr = ibv_reg_mr(g_pd, addr, len, IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-registration-in-datapath -- cache miss; hits return the kept MR above
	return g_rcache[slot].mr;
}

/* same as xs_push_user() for callers that reuse their buffers */
int xs_push_cached(void *ubuf, size_t len, uint64_t raddr)
{
	struct ibv_mr *mr = xs_rcache_get(ubuf, len);

	if (!mr)
		return -errno;
	ibv_wr_start(g_qpx);
	g_qpx->wr_id = XS_WRID_USER;
	g_qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(g_qpx, g_remote.rkey, raddr);
	ibv_wr_set_sge(g_qpx, mr->lkey, (uintptr_t)ubuf, (uint32_t)len);
	if (ibv_wr_complete(g_qpx))
		return -EIO;
	return xs_wait_user();
}

int xs_push_unaligned(const void *data, size_t len, uint64_t raddr)
{
	int ret = xs_grow_stage(len);

	if (ret)
		return ret;
	memcpy(g_stage, data, len);
	ibv_wr_start(g_qpx);
	g_qpx->wr_id = XS_WRID_USER;
	g_qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(g_qpx, g_remote.rkey, raddr);
	ibv_wr_set_sge(g_qpx, g_stage_mr->lkey, (uintptr_t)g_stage, (uint32_t)len);
	if (ibv_wr_complete(g_qpx))
		return -EIO;
	return xs_wait_user();
}

static int xs_ctl_send(uint32_t code)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(g_ctl_buf + XS_CTL_RX_DEPTH * XS_CTL_MSG),
		.length = sizeof(code),
		.lkey = g_ctl_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_SEND,
		.sg_list = &sge,
		.num_sge = 1,
		.send_flags = 0,	// OK: rdma-unsignaled-send-starvation -- the control QP is created with sq_sig_all = 1
	}, *bad;

	memcpy(g_ctl_buf + XS_CTL_RX_DEPTH * XS_CTL_MSG, &code, sizeof(code));
	return ibv_post_send(g_ctl_qp, &wr, &bad) ? -errno : 0;
}

static void xs_teardown(void)
{
	unsigned int i;

	for (i = 0; i < XS_RCACHE_SIZE; i++)
		if (g_rcache[i].mr)
			ibv_dereg_mr(g_rcache[i].mr);
	if (g_ctl_qp)
		ibv_destroy_qp(g_ctl_qp);
	if (g_qp)
		ibv_destroy_qp(g_qp);
	if (g_stage_mr)
		ibv_dereg_mr(g_stage_mr);
	if (g_ctl_mr)
		ibv_dereg_mr(g_ctl_mr);
	if (g_cnt_mr)
		ibv_dereg_mr(g_cnt_mr);
	if (g_ring_mr)
		ibv_dereg_mr(g_ring_mr);
	free(g_stage);
	free(g_ctl_buf);
	free(g_cnt);
	free(g_ring);
	if (g_cq)
		ibv_destroy_cq(g_cq);
	if (g_pd)
		ibv_dealloc_pd(g_pd);
}

int xs_run(struct ibv_context *ctx, int sock, uint64_t nchunks)
{
	uint64_t c;
	int ret;

	g_ctx = ctx;
	g_pd = ibv_alloc_pd(ctx);
	g_cq = g_pd ? ibv_create_cq(ctx, XS_TX_DEPTH + XS_CTL_RX_DEPTH, NULL, NULL, 0) : NULL;
	if (!g_cq) {
		ret = -ENOMEM;
		goto out;
	}
	ret = xs_reg_buffers();
	if (!ret)
		ret = xs_grow_stage(XS_SEG_SIZE);
	if (!ret)
		ret = xs_create_data_qp();
	if (!ret)
		ret = xs_create_ctl_qp();
	if (!ret)
		ret = xs_handshake(sock);
	if (ret)
		goto out;

	for (c = 0; c < nchunks && !ret; c++)
		ret = xs_post_chunk(c);
	if (!ret)
		ret = xs_ctl_send(0xD0E);
	if (ret == -EIO && !xs_ctl_rearm())
		ret = xs_ctl_send(0xBAD);
	printf("posted %lu work requests\n", g_posted_total);
out:
	xs_teardown();
	return ret;
}
