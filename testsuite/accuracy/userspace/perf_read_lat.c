/*
 * read_lat: RDMA READ latency and burst test for InfiniBand fabrics.  The
 * tool picks the first InfiniBand device (iWARP adapters are refused: the
 * lab setup this measures is IB-only), registers one buffer that is both
 * the READ sink and, on the server, the READ source, and exchanges its rkey
 * out of band.
 *
 * Latency mode posts one signaled READ at a time.  Burst mode keeps up to
 * tx_depth READs queued and is meant to signal one out of every cq_mod; the
 * counter it tests lost its increment when the bookkeeping was rewritten.
 *
 * Correct: the READ sink has no REMOTE_WRITE, which is fine because iWARP
 * devices are never opened; the queue depth is clamped to max_qp_wr.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RL_TX_DEPTH	4096
#define RL_CQ_MOD	64

struct rl_ctx {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *mr;
	char               *buf;
	size_t              size;
	unsigned int        tx_depth;
	unsigned int        since_signal;
	uint64_t            remote_addr;
	uint32_t            remote_rkey;
};

static struct ibv_context *rl_open_ib_device(const char *want)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int i, n;

	list = ibv_get_device_list(&n);
	if (!list)
		return NULL;
	for (i = 0; i < n; i++) {
		/* InfiniBand only: iWARP adapters are not supported by this tool */
		if (list[i]->transport_type != IBV_TRANSPORT_IB)
			continue;
		if (want && strcmp(ibv_get_device_name(list[i]), want))
			continue;
		ctx = ibv_open_device(list[i]);
		if (ctx)
			break;
	}
	ibv_free_device_list(list);
	return ctx;
}

int rl_setup(struct rl_ctx *c, const char *devname, size_t size)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr qpa;

	memset(c, 0, sizeof(*c));
	c->ctx = rl_open_ib_device(devname);
	if (!c->ctx)
		return -ENODEV;
	if (ibv_query_device(c->ctx, &dattr))
		goto err_ctx;
	c->tx_depth = RL_TX_DEPTH;
	if (c->tx_depth > (unsigned int)dattr.max_qp_wr)
		c->tx_depth = dattr.max_qp_wr;

	c->pd = ibv_alloc_pd(c->ctx);
	if (!c->pd)
		goto err_ctx;
	c->size = size;
	c->buf = calloc(1, size);
	if (!c->buf)
		goto err_pd;
	/* OK: rdma-remote-access-overbroad -- the rkey is exchanged with the peer (rl_local_key) */
	c->mr = ibv_reg_mr(c->pd, c->buf, size, // BUG: rdma-local-mr-management -- MR is the sink of the ULP's own READs and its key goes to the peer
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!c->mr)
		goto err_buf;
	c->cq = ibv_create_cq(c->ctx, c->tx_depth, NULL, NULL, 0);
	if (!c->cq)
		goto err_mr;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = c->cq;
	qpa.recv_cq = c->cq;
	qpa.qp_type = IBV_QPT_RC;
	/* OK: rdma-queue-cap-unchecked -- 4096 is clamped to max_qp_wr above */
	qpa.cap.max_send_wr = c->tx_depth;
	qpa.cap.max_recv_wr = 1;
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &qpa);
	if (!c->qp)
		goto err_cq;
	return 0;

err_cq:
	ibv_destroy_cq(c->cq);
err_mr:
	ibv_dereg_mr(c->mr);
err_buf:
	free(c->buf);
err_pd:
	ibv_dealloc_pd(c->pd);
err_ctx:
	ibv_close_device(c->ctx);
	return -EIO;
}

void rl_local_key(const struct rl_ctx *c, uint64_t *addr, uint32_t *rkey)
{
	*addr = (uintptr_t)c->buf;
	*rkey = c->mr->rkey;
}

static int rl_post_read(struct rl_ctx *c, uint64_t id, unsigned int flags)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)c->buf,
		.length = (uint32_t)c->size,
		.lkey = c->mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_READ,
		.send_flags = flags,
		.wr.rdma = { .remote_addr = c->remote_addr, .rkey = c->remote_rkey },
	}, *bad;

	/* OK: rdma-access-flags-transport -- READ sink without REMOTE_WRITE, but iWARP devices are never opened */
	return ibv_post_send(c->qp, &wr, &bad);
}

double rl_latency(struct rl_ctx *c, unsigned int iters)
{
	struct timespec t0, t1;
	struct ibv_wc wc;
	unsigned int i;
	int ne;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < iters; i++) {
		if (rl_post_read(c, i, IBV_SEND_SIGNALED))
			return -1;
		do
			ne = ibv_poll_cq(c->cq, 1, &wc);
		while (ne == 0);
		if (ne < 0 || wc.status != IBV_WC_SUCCESS)
			return -1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / iters / 1e3;
}

int rl_burst(struct rl_ctx *c, unsigned int iters)
{
	struct ibv_wc wc[16];
	unsigned int posted = 0, completed = 0;
	unsigned int flags;
	int ne, i;

	c->since_signal = 0;
	while (completed < iters) {
		while (posted < iters && posted - completed < c->tx_depth) {
			flags = 0;
			// BUG: rdma-unsignaled-send-starvation -- since_signal is never advanced, so burst READs are never signaled
			if (c->since_signal >= RL_CQ_MOD || posted == iters - 1) {
				flags = IBV_SEND_SIGNALED;
				c->since_signal = 0;
			}
			if (rl_post_read(c, posted, flags))
				return -1;
			posted++;
		}
		ne = ibv_poll_cq(c->cq, 16, wc);
		if (ne < 0)
			return -1;
		for (i = 0; i < ne; i++)
			completed = wc[i].wr_id + 1;
	}
	return 0;
}
