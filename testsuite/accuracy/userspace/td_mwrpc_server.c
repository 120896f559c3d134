/*
 * td_mwrpc_server.c - "mwrpc" reply server.  Results are published to the
 * client through type-2 memory windows, one window per in-flight request.
 *
 *   client -> server  REQ  {id, addr, rkey, len}  the server RDMA READs the
 *                          request payload into its staging pool
 *   server -> client  RESP {id, tag, addr, rkey}  window over the reply slot;
 *                          the client reads the result, writes a status word
 *   client -> server  ACK  {tag}                  LOCAL_INV, slot recycled
 * Keepalive pings use a second RC QP; a per-connection status page is
 * exposed through one long-lived window.  Only InfiniBand-transport devices
 * are opened.
 *
 * Problems: the data SQ reserves two WRs per request (READ, BIND_MW, SEND
 * and LOCAL_INV are posted); the status window grants remote write over an
 * MR without local write; pings test a counter nothing advances; the SGE
 * count is never compared with the device.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define MWR_MAX_DEPTH		256
#define MWR_SLOT_SIZE		4096
#define MWR_HDR_SIZE		64
#define MWR_SEND_SGE		8	/* header + up to 7 result fragments */
#define MWR_INLINE		64
#define MWR_CTRL_DEPTH		16
#define MWR_PING_SIGNAL_EVERY	8
#define MWR_SIG_BATCH		16

#define MWR_WRID(kind, idx)	(((uint64_t)(kind) << 32) | (uint32_t)(idx))
#define MWR_WRID_KIND(id)	((uint32_t)((id) >> 32))
#define MWR_WRID_IDX(id)	((uint32_t)(id))

enum mwr_kind { MWR_K_RECV = 1, MWR_K_READ, MWR_K_BIND, MWR_K_SEND, MWR_K_INV, MWR_K_PING };
enum mwr_op { MWR_OP_REQ = 1, MWR_OP_RESP, MWR_OP_ACK, MWR_OP_PING };

struct mwr_hdr {
	uint32_t op;
	uint32_t id;		/* client's request id */
	uint32_t tag;		/* server slot, echoed in ACK */
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct mwr_req {
	uint32_t		idx;
	uint32_t		client_id;
	char			*slot;
	char			*stage;
	struct ibv_mw		*mw;
	uint32_t		rkey;
	struct mwr_hdr		*tx_hdr;
	struct ibv_sge		send_sge;
	struct ibv_sge		read_sge;
	struct ibv_send_wr	read_wr;
	struct ibv_send_wr	bind_wr;
	struct ibv_send_wr	send_wr;
	struct ibv_send_wr	inv_wr;
	struct mwr_req		*next_free;
};

struct mwr_ep {
	struct ibv_context	*ctx;
	struct ibv_device_attr	dev_attr;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;		/* requests and responses */
	struct ibv_qp		*ctrl_qp;	/* keepalive */
	uint32_t		depth;
	uint32_t		sig_batch;
	uint32_t		sig_countdown;
	unsigned int		ping_unsignaled;
	uint32_t		ping_seq;

	char			*reply_pool;
	struct ibv_mr		*reply_mr;
	char			*hdr_pool;	/* depth rx headers, then depth tx headers */
	struct ibv_mr		*hdr_mr;
	char			*stage_pool;
	struct ibv_mr		*stage_mr;
	char			*status_page;
	struct ibv_mr		*status_mr;
	struct ibv_mw		*status_mw;
	uint32_t		status_rkey;

	struct mwr_req		*reqs;
	struct mwr_req		*free_list;
};

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct ibv_context *mwr_open_ib_device(const char *name)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int i, n;

	list = ibv_get_device_list(&n);
	if (!list)
		return NULL;
	for (i = 0; i < n; i++) {
		/* type-2 windows and the RESP layout are only deployed on IB fabrics */
		if (list[i]->transport_type != IBV_TRANSPORT_IB)
			continue;
		if (name && strcmp(ibv_get_device_name(list[i]), name))
			continue;
		ctx = ibv_open_device(list[i]);
		if (ctx)
			break;
	}
	ibv_free_device_list(list);
	return ctx;
}

static void mwr_reg_pools(struct mwr_ep *ep)
{
	size_t pool = (size_t)ep->depth * MWR_SLOT_SIZE;

	ep->reply_pool = aligned_alloc(4096, pool);
	ep->stage_pool = aligned_alloc(4096, pool);
	ep->hdr_pool = calloc(2 * ep->depth, MWR_HDR_SIZE);
	ep->status_page = aligned_alloc(4096, MWR_SLOT_SIZE);
	if (!ep->reply_pool || !ep->stage_pool || !ep->hdr_pool || !ep->status_page)
		die("alloc pools");

	ep->reply_mr = ibv_reg_mr(ep->pd, ep->reply_pool, pool,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	ep->stage_mr = ibv_reg_mr(ep->pd, ep->stage_pool, pool, IBV_ACCESS_LOCAL_WRITE);
	ep->hdr_mr = ibv_reg_mr(ep->pd, ep->hdr_pool, 2 * ep->depth * MWR_HDR_SIZE,
				IBV_ACCESS_LOCAL_WRITE);
	/* the status page is written by the CPU only; the window gives the peer access */
	ep->status_mr = ibv_reg_mr(ep->pd, ep->status_page, MWR_SLOT_SIZE, IBV_ACCESS_MW_BIND);
	if (!ep->reply_mr || !ep->stage_mr || !ep->hdr_mr || !ep->status_mr)
		die("ibv_reg_mr");
}

static void mwr_create_qps(struct mwr_ep *ep)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* a response is a bind plus its SEND; one spare for the status bind */
	attr.cap.max_send_wr = 2 * ep->depth + 1; // BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- each request posts READ, BIND_MW, SEND and LOCAL_INV, the hand-made factor reserves 2
	attr.cap.max_recv_wr = ep->depth;
	attr.cap.max_send_sge = MWR_SEND_SGE; // BUG: rdma-queue-cap-unchecked -- 8 SGEs requested, dev_attr.max_sge is never consulted
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = MWR_INLINE;
	ep->qp = ibv_create_qp(ep->pd, &attr);
	if (!ep->qp)
		die("ibv_create_qp(data)");

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = MWR_CTRL_DEPTH;
	attr.cap.max_recv_wr = MWR_CTRL_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct mwr_hdr);
	ep->ctrl_qp = ibv_create_qp(ep->pd, &attr);
	if (!ep->ctrl_qp)
		die("ibv_create_qp(ctrl)");
}

static struct mwr_ep *mwr_ep_open(const char *devname, uint32_t depth)
{
	struct mwr_ep *ep;
	uint32_t i;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		die("calloc");
	ep->ctx = mwr_open_ib_device(devname);
	if (!ep->ctx || ibv_query_device(ep->ctx, &ep->dev_attr))
		die("open device");
	if (!(ep->dev_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B)) {
		fprintf(stderr, "mwrpc: %s has no type-2B windows\n",
			ibv_get_device_name(ep->ctx->device));
		exit(1);
	}
	if (depth > MWR_MAX_DEPTH)
		depth = MWR_MAX_DEPTH;
	if (2 * depth + 1 > (uint32_t)ep->dev_attr.max_qp_wr)
		depth = (ep->dev_attr.max_qp_wr - 1) / 2;
	ep->depth = depth;
	ep->sig_batch = depth < MWR_SIG_BATCH ? depth : MWR_SIG_BATCH;
	ep->sig_countdown = ep->sig_batch;

	ep->pd = ibv_alloc_pd(ep->ctx);
	ep->cq = ibv_create_cq(ep->ctx, 4 * depth + 2 * MWR_CTRL_DEPTH, NULL, NULL, 0);
	if (!ep->pd || !ep->cq)
		die("pd/cq");
	mwr_reg_pools(ep);
	mwr_create_qps(ep);

	ep->status_mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2);
	ep->reqs = calloc(depth, sizeof(*ep->reqs));
	if (!ep->status_mw || !ep->reqs)
		die("status window");
	for (i = 0; i < depth; i++) {
		struct mwr_req *req = &ep->reqs[i];

		req->idx = i;
		req->slot = ep->reply_pool + (size_t)i * MWR_SLOT_SIZE;
		req->stage = ep->stage_pool + (size_t)i * MWR_SLOT_SIZE;
		req->tx_hdr = (struct mwr_hdr *)(ep->hdr_pool + (size_t)(depth + i) * MWR_HDR_SIZE);
		req->mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2);
		if (!req->mw)
			die("ibv_alloc_mw");
		req->rkey = req->mw->rkey;
		req->next_free = ep->free_list;
		ep->free_list = req;
	}
	return ep;
}

static void mwr_signal(struct mwr_ep *ep, struct ibv_send_wr *wr)
{
	/* OK: rdma-unsignaled-send-starvation -- countdown decremented on every response, reloaded when it fires */
	if (--ep->sig_countdown == 0) {
		wr->send_flags |= IBV_SEND_SIGNALED;
		ep->sig_countdown = ep->sig_batch;
	}
}

static int mwr_pull_request(struct mwr_ep *ep, struct mwr_req *req, const struct mwr_hdr *rx)
{
	struct ibv_send_wr *bad;

	req->client_id = rx->id;
	req->read_sge = (struct ibv_sge){ (uintptr_t)req->stage,
					  rx->len < MWR_SLOT_SIZE ? rx->len : MWR_SLOT_SIZE,
					  ep->stage_mr->lkey };

	req->read_wr = (struct ibv_send_wr){
		.wr_id = MWR_WRID(MWR_K_READ, req->idx),
		.sg_list = &req->read_sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = rx->addr, .rkey = rx->rkey },
	};
	return ibv_post_send(ep->qp, &req->read_wr, &bad); // OK: rdma-access-flags-transport -- local-write-only sink, but the program only opens InfiniBand-transport devices
}

static int mwr_send_response(struct mwr_ep *ep, struct mwr_req *req, uint32_t len)
{
	struct ibv_send_wr *bad;

	req->rkey = ibv_inc_rkey(req->rkey);

	memset(&req->bind_wr, 0, sizeof(req->bind_wr));
	req->bind_wr.wr_id = MWR_WRID(MWR_K_BIND, req->idx);
	req->bind_wr.opcode = IBV_WR_BIND_MW;
	req->bind_wr.bind_mw.mw = req->mw;
	req->bind_wr.bind_mw.rkey = req->rkey;
	req->bind_wr.bind_mw.bind_info.mr = ep->reply_mr;
	req->bind_wr.bind_mw.bind_info.addr = (uintptr_t)req->slot;
	req->bind_wr.bind_mw.bind_info.length = MWR_SLOT_SIZE;
	req->bind_wr.bind_mw.bind_info.mw_access_flags =
		IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE; // OK: rdma-access-flags-invalid -- reply_mr was registered with LOCAL_WRITE and MW_BIND
	req->bind_wr.next = &req->send_wr;

	*req->tx_hdr = (struct mwr_hdr){ MWR_OP_RESP, req->client_id, req->idx,
					 (uintptr_t)req->slot, req->rkey, len };

	req->send_sge = (struct ibv_sge){ (uintptr_t)req->tx_hdr, sizeof(*req->tx_hdr), ep->hdr_mr->lkey };
	req->send_wr = (struct ibv_send_wr){
		.wr_id = MWR_WRID(MWR_K_SEND, req->idx),
		.sg_list = &req->send_sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE,
	};
	mwr_signal(ep, &req->send_wr);

	return ibv_post_send(ep->qp, &req->bind_wr, &bad);
}

static int mwr_invalidate(struct mwr_ep *ep, struct mwr_req *req)
{
	struct ibv_send_wr *bad;

	/* signaled: the slot goes back to the free list from this completion */
	req->inv_wr = (struct ibv_send_wr){
		.wr_id = MWR_WRID(MWR_K_INV, req->idx),
		.opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = req->rkey,
	};
	return ibv_post_send(ep->qp, &req->inv_wr, &bad);
}

static int mwr_publish_status(struct mwr_ep *ep)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int n, ret;

	ep->status_rkey = ibv_inc_rkey(ep->status_mw->rkey);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = MWR_WRID(MWR_K_BIND, UINT32_MAX);
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = ep->status_mw;
	wr.bind_mw.rkey = ep->status_rkey;
	/* BUG: rdma-access-flags-invalid -- remote-write window over status_mr, which has MW_BIND but no LOCAL_WRITE */
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = ep->status_mr,
		.addr = (uintptr_t)ep->status_page,
		.length = MWR_SLOT_SIZE,
		/* the client reads the counters and sets its drain flag here */
		.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
	};
	ret = ibv_post_send(ep->qp, &wr, &bad);
	if (ret)
		return ret;
	do {
		n = ibv_poll_cq(ep->cq, 1, &wc);
	} while (n == 0);
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	return 0;
}

static int mwr_send_ping(struct mwr_ep *ep)
{
	struct mwr_hdr ping = { .op = MWR_OP_PING, .id = ep->ping_seq++ };
	struct ibv_sge sge = { .addr = (uintptr_t)&ping, .length = sizeof(ping) };
	struct ibv_send_wr wr = {
		.wr_id = MWR_WRID(MWR_K_PING, 0),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE,
	};
	struct ibv_send_wr *bad;

	if (ep->ping_unsignaled >= MWR_PING_SIGNAL_EVERY) { // BUG: rdma-unsignaled-send-starvation -- ping_unsignaled is only ever reset, so no ping is signaled and the ctrl SQ fills after 16 pings
		wr.send_flags |= IBV_SEND_SIGNALED;
		ep->ping_unsignaled = 0;
	}
	return ibv_post_send(ep->ctrl_qp, &wr, &bad);
}

static int mwr_post_recv(struct mwr_ep *ep, uint32_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(ep->hdr_pool + (size_t)slot * MWR_HDR_SIZE),
		.length = MWR_HDR_SIZE,
		.lkey = ep->hdr_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = MWR_WRID(MWR_K_RECV, slot),
		.sg_list = &sge,
		.num_sge = 1,
	}, *bad;

	return ibv_post_recv(ep->qp, &wr, &bad);
}

static void mwr_handle_recv(struct mwr_ep *ep, uint32_t slot)
{
	struct mwr_hdr *rx = (struct mwr_hdr *)(ep->hdr_pool + (size_t)slot * MWR_HDR_SIZE);
	struct mwr_req *req;

	switch (rx->op) {
	case MWR_OP_REQ:
		req = ep->free_list;
		if (!req)
			break;		/* client exceeded its credits; it retries */
		ep->free_list = req->next_free;
		if (mwr_pull_request(ep, req, rx))
			die("pull");
		break;
	case MWR_OP_ACK:
		if (rx->tag < ep->depth)
			mwr_invalidate(ep, &ep->reqs[rx->tag]);
		break;
	default:
		break;
	}
	mwr_post_recv(ep, slot);
}

static int mwr_poll(struct mwr_ep *ep)
{
	struct ibv_wc wc[16];
	int i, n;

	n = ibv_poll_cq(ep->cq, 16, wc);
	for (i = 0; i < n; i++) {
		uint32_t idx = MWR_WRID_IDX(wc[i].wr_id);
		struct mwr_req *req = idx < ep->depth ? &ep->reqs[idx] : NULL;

		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "mwrpc: wr %#llx failed: %s\n",
				(unsigned long long)wc[i].wr_id,
				ibv_wc_status_str(wc[i].status));
			return -EIO;
		}
		switch (MWR_WRID_KIND(wc[i].wr_id)) {
		case MWR_K_RECV:
			mwr_handle_recv(ep, idx);
			break;
		case MWR_K_READ:
			/* the handler runs on the staged payload and fills req->slot */
			mwr_send_response(ep, req, MWR_SLOT_SIZE);
			break;
		case MWR_K_INV:
			req->next_free = ep->free_list;
			ep->free_list = req;
			break;
		default:
			break;
		}
	}
	return n;
}

int main(int argc, char **argv)
{
	struct mwr_ep *ep;
	uint32_t depth = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
	unsigned long idle = 0;
	uint32_t i;
	int n;

	ep = mwr_ep_open(argc > 1 ? argv[1] : NULL, depth);
	/* QP connection (out-of-band exchange, INIT/RTR/RTS) is done by mwr_cm */
	if (mwr_publish_status(ep))
		die("status window bind");
	for (i = 0; i < ep->depth; i++)
		if (mwr_post_recv(ep, i))
			die("ibv_post_recv");
	for (;;) {
		n = mwr_poll(ep);
		if (n < 0)
			break;
		if (n == 0 && ++idle == 1u << 20) {
			idle = 0;
			mwr_send_ping(ep);
		}
	}
	return 1;
}
