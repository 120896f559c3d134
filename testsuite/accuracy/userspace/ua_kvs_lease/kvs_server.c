/*
 * kvs_server.c - FaRM-style store: segments registered once for remote
 * access (rkeys announced; re-registered read-only while a compaction epoch
 * freezes them, deregistered when retired), per-client index leases as
 * type-2 windows (bound with a rotated key, revoked by LOCAL_INV and freed
 * from its completion, or ended by the client's SEND_WITH_INV).
 * Bugs: freeze drops LOCAL_WRITE but keeps REMOTE_ATOMIC, a failed
 * announcement leaks the segment MR, retire frees memory before
 * deregistering, a failed GRANT recycles a bound window, a plain BYE
 * recycles the lease right after an unsignaled LOCAL_INV, the inline size is
 * not checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include "kvs_proto.h"

#define KVS_SEG_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | \
			 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

enum { KVS_OP_RECV = 1, KVS_OP_SEND, KVS_OP_BIND, KVS_OP_INV };
#define KVS_WRID(p, op)		((uint64_t)(uintptr_t)(p) | (op))

struct kvs_client;

struct kvs_lease {
	struct kvs_lease	*next;		/* g_store.free_leases */
	struct kvs_client	*cli;
	struct ibv_mw		*mw;
	uint32_t		rkey;
	uint64_t		expires;
};

struct kvs_rx {
	struct kvs_client	*cli;
	struct ibv_recv_wr	wr;
	struct ibv_sge		sge;
	struct kvs_msg		msg;
};

struct kvs_client {
	struct rdma_cm_id	*id;
	struct ibv_qp		*qp;
	struct kvs_rx		rx[KVS_CLIENT_CREDITS];
	struct ibv_mr		*rx_mr;
	unsigned		sends;
	struct kvs_lease	*lease;
	uint32_t		mbox_rkey;
};

static struct kvs_store {
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	void			*seg_mem[KVS_MAX_SEGS];
	struct ibv_mr		*seg_mr[KVS_MAX_SEGS];
	int			nsegs;
	uint32_t		epoch;
	void			*index;
	struct ibv_mr		*index_mr;
	struct kvs_lease	leases[KVS_MAX_CLIENTS];
	struct kvs_lease	*free_leases;
	struct kvs_client	*clients[KVS_MAX_CLIENTS];
} g_store;

static int kvs_send(struct kvs_client *cli, struct kvs_msg *msg, uint32_t inv_rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = sizeof(*msg) };
	struct ibv_send_wr wr = { .wr_id = KVS_WRID(cli, KVS_OP_SEND), .sg_list = &sge, .num_sge = 1 }, *bad;

	wr.opcode = inv_rkey ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND;
	wr.invalidate_rkey = inv_rkey;
	wr.send_flags = IBV_SEND_INLINE | ((++cli->sends % 8) == 0 ? IBV_SEND_SIGNALED : 0);
	return ibv_post_send(cli->qp, &wr, &bad);
}

static int kvs_broadcast(struct kvs_msg *msg)
{
	int i, ret = 0;

	for (i = 0; i < KVS_MAX_CLIENTS; i++)
		if (g_store.clients[i] && kvs_send(g_store.clients[i], msg, 0))
			ret = -EIO;
	return ret;
}

static void kvs_lease_put(struct kvs_lease *lease)
{
	lease->cli = NULL;
	lease->next = g_store.free_leases;
	g_store.free_leases = lease;
}

int kvs_store_init(struct ibv_context *ctx)
{
	struct kvs_store *st = &g_store;
	int i;

	st->pd = ibv_alloc_pd(ctx);
	st->cq = ibv_create_cq(ctx, 1024, NULL, NULL, 0);
	st->index = aligned_alloc(4096, KVS_INDEX_SIZE);
	if (!st->pd || !st->cq || !st->index)
		return -ENOMEM;
	/* no remote rights of its own: clients reach the index through lease windows */
	st->index_mr = ibv_reg_mr(st->pd, st->index, KVS_INDEX_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!st->index_mr)
		return -errno;
	for (i = 0; i < KVS_MAX_CLIENTS; i++) {
		st->leases[i].mw = ibv_alloc_mw(st->pd, IBV_MW_TYPE_2); /* BUG: rdma-local-mr-management -- lease windows managed by the ULP */
		if (!st->leases[i].mw)
			goto err_mw;
		kvs_lease_put(&st->leases[i]);
	}
	return 0;

err_mw:
	while (i--)
		ibv_dealloc_mw(st->leases[i].mw); /* OK: rdma-mr-leak -- while (i--) releases every window allocated before the failure */
	ibv_dereg_mr(st->index_mr);
	return -ENOMEM;
}

int kvs_seg_add(void)
{
	struct kvs_store *st = &g_store;
	int n = st->nsegs;
	struct kvs_msg msg = { .type = KVS_MSG_SEGMENT, .seg = n, .len = KVS_SEG_SIZE };

	if (n == KVS_MAX_SEGS || !(st->seg_mem[n] = aligned_alloc(2UL << 20, KVS_SEG_SIZE)))
		return -ENOMEM;
	/* OK: rdma-registration-in-datapath -- memory allocated right here; segment setup that announces itself */
	st->seg_mr[n] = ibv_reg_mr(st->pd, st->seg_mem[n], KVS_SEG_SIZE, KVS_SEG_ACCESS); /* BUG: rdma-local-mr-management -- the segment's rkey is announced to every client */
	if (!st->seg_mr[n]) {
		free(st->seg_mem[n]);
		return -errno;
	}
	msg.epoch = st->epoch;
	msg.rkey = st->seg_mr[n]->rkey;
	msg.addr = (uintptr_t)st->seg_mem[n];
	if (kvs_broadcast(&msg) < 0)
		return -EIO; /* BUG: rdma-mr-leak -- seg_mr[n] stays registered but nsegs is not advanced; the next add overwrites it */
	st->nsegs++;
	return 0;
}

/* compaction: stop remote writers for one epoch, then let them back */
int kvs_seg_freeze(int n, int frozen)
{
	g_store.epoch++;
	if (frozen)
		return ibv_rereg_mr(g_store.seg_mr[n], IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC); /* BUG: rdma-access-flags-invalid -- REMOTE_ATOMIC (kept for lock words) without LOCAL_WRITE; the rereg fails */
	return ibv_rereg_mr(g_store.seg_mr[n], IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, KVS_SEG_ACCESS); /* OK: rdma-access-flags-invalid -- KVS_SEG_ACCESS includes LOCAL_WRITE */
}

/* the last live item moved out: tell the clients, give the memory back */
int kvs_seg_retire(int n)
{
	struct kvs_msg msg = { .type = KVS_MSG_SEGMENT, .seg = n, .epoch = ++g_store.epoch };

	kvs_broadcast(&msg);
	free(g_store.seg_mem[n]); /* BUG: rdma-invalidation-leak -- the segment's announced rkey (remote write) is still valid when its memory is freed; dereg comes after */
	ibv_dereg_mr(g_store.seg_mr[n]);
	g_store.seg_mem[n] = NULL;
	g_store.seg_mr[n] = NULL;
	return 0;
}

int kvs_on_connect(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = g_store.cq, .recv_cq = g_store.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4 * KVS_CLIENT_CREDITS, .max_recv_wr = KVS_CLIENT_CREDITS,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = sizeof(struct kvs_msg) }, /* BUG(file): rdma-queue-cap-unchecked -- 96 bytes of inline data, never compared with what the device grants */
	};
	struct kvs_client *cli = NULL;
	struct ibv_recv_wr *bad;
	int i, slot;

	for (slot = 0; slot < KVS_MAX_CLIENTS && g_store.clients[slot]; slot++)
		;
	if (slot == KVS_MAX_CLIENTS || !(cli = calloc(1, sizeof(*cli))) ||
	    rdma_create_qp(id, g_store.pd, &attr))
		goto err_free;
	cli->id = id;
	cli->qp = id->qp;
	cli->rx_mr = ibv_reg_mr(g_store.pd, cli->rx, sizeof(cli->rx), IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- receive ring registered once for local access */
	for (i = 0; cli->rx_mr && i < KVS_CLIENT_CREDITS; i++) {
		struct kvs_rx *rx = &cli->rx[i];

		rx->cli = cli;
		rx->sge = (struct ibv_sge){ (uintptr_t)&rx->msg, sizeof(rx->msg), cli->rx_mr->lkey };
		rx->wr = (struct ibv_recv_wr){ .wr_id = KVS_WRID(rx, KVS_OP_RECV), .sg_list = &rx->sge, .num_sge = 1 };
		if (ibv_post_recv(cli->qp, &rx->wr, &bad)) {
			ibv_dereg_mr(cli->rx_mr); /* OK: rdma-mr-leak -- the receive ring is released before the client is freed */
			cli->rx_mr = NULL;
		}
	}
	if (!cli->rx_mr) {
		rdma_destroy_qp(id);
		goto err_free;
	}
	g_store.clients[slot] = cli;
	return rdma_accept(id, NULL);

err_free:
	free(cli);
	return rdma_reject(id, NULL, 0);
}

static int kvs_grant_lease(struct kvs_client *cli, uint64_t now)
{
	struct kvs_store *st = &g_store;
	struct kvs_lease *lease = st->free_leases;
	struct ibv_send_wr wr, *bad;
	struct kvs_msg msg;

	if (!lease)
		return -EBUSY;
	st->free_leases = lease->next;
	lease->cli = cli;
	lease->expires = now + KVS_LEASE_MS;
	lease->rkey = ibv_inc_rkey(lease->mw->rkey);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = KVS_WRID(lease, KVS_OP_BIND);
	wr.opcode = IBV_WR_BIND_MW; /* BUG: rdma-local-mr-management -- window bound to give the client a key to the index */
	wr.bind_mw.mw = lease->mw;
	wr.bind_mw.rkey = lease->rkey; /* OK: rdma-rkey-reuse -- rotated with ibv_inc_rkey() above */
	wr.bind_mw.bind_info.mr = st->index_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)st->index;
	wr.bind_mw.bind_info.length = KVS_INDEX_SIZE;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_post_send(cli->qp, &wr, &bad)) {
		kvs_lease_put(lease); /* OK: rdma-invalidation-leak -- the bind was never posted */
		return -EIO;
	}
	msg = (struct kvs_msg){ .type = KVS_MSG_GRANT, .epoch = st->epoch, .rkey = lease->rkey,
				.addr = (uintptr_t)st->index, .len = KVS_LEASE_MS };
	if (kvs_send(cli, &msg, 0)) {
		kvs_lease_put(lease); /* BUG: rdma-invalidation-leak -- the window was bound (post succeeded) and goes back to the pool without LOCAL_INV */
		return -EAGAIN;
	}
	cli->lease = lease;
	return 0;
}

static int kvs_post_inv(struct kvs_lease *lease, int signaled)
{
	struct ibv_send_wr wr = { .wr_id = KVS_WRID(lease, KVS_OP_INV), .opcode = IBV_WR_LOCAL_INV }, *bad;

	wr.invalidate_rkey = lease->rkey;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	return ibv_post_send(lease->cli->qp, &wr, &bad);
}

/* expired leases: revoke the index window, then the client's mailbox */
void kvs_lease_reaper(uint64_t now)
{
	struct kvs_msg msg = { .type = KVS_MSG_REVOKE };
	struct kvs_lease *lease;
	int i;

	for (i = 0; i < KVS_MAX_CLIENTS; i++) {
		lease = &g_store.leases[i];
		if (!lease->cli || lease->expires > now || kvs_post_inv(lease, 1))
			continue;
		lease->expires = UINT64_MAX;	/* freed by the LOCAL_INV completion */
		lease->cli->lease = NULL;
		msg.epoch = g_store.epoch;
		kvs_send(lease->cli, &msg, lease->cli->mbox_rkey);
	}
}

static void kvs_handle_bye(struct kvs_client *cli, struct ibv_wc *wc)
{
	struct kvs_lease *lease = cli->lease;

	if (!lease)
		return;
	cli->lease = NULL;
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (wc->invalidated_rkey != lease->rkey) { /* OK: rdma-remote-invalidate-unchecked -- the invalidated key is compared with the lease's */
			fprintf(stderr, "kvs: client invalidated 0x%x, lease is 0x%x\n", wc->invalidated_rkey, lease->rkey);
			rdma_disconnect(cli->id);
			return;
		}
		kvs_lease_put(lease); /* OK: rdma-invalidation-leak -- the client invalidated exactly this lease's key */
		return;
	}
	/* older clients send a plain BYE */
	kvs_post_inv(lease, 0);
	kvs_lease_put(lease); /* BUG: rdma-unmap-before-invalidate -- lease window back in the pool right after an unsignaled LOCAL_INV */
}

int kvs_server_poll(uint64_t now)
{
	struct ibv_recv_wr *bad;
	struct ibv_wc wc[16];
	struct kvs_rx *rx;
	int i, n;

	n = ibv_poll_cq(g_store.cq, 16, wc);
	for (i = 0; i < n; i++) {
		void *ptr = (void *)(uintptr_t)(wc[i].wr_id & ~7ULL);

		if ((wc[i].wr_id & 7) == KVS_OP_INV) {
			kvs_lease_put(ptr); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the LOCAL_INV completion */
			continue;
		}
		if ((wc[i].wr_id & 7) != KVS_OP_RECV || wc[i].status != IBV_WC_SUCCESS)
			continue;
		rx = ptr;
		if (rx->msg.type == KVS_MSG_HELLO)
			rx->cli->mbox_rkey = rx->msg.rkey;
		if (rx->msg.type == KVS_MSG_BYE)
			kvs_handle_bye(rx->cli, &wc[i]);
		else if (rx->cli->lease)
			rx->cli->lease->expires = now + KVS_LEASE_MS;	/* any message renews */
		else
			kvs_grant_lease(rx->cli, now);
		ibv_post_recv(rx->cli->qp, &rx->wr, &bad);
	}
	return n;
}
