/*
 * kvd_lease.c - lease manager of the kvd RDMA key-value daemon.
 *
 * Values live in one arena registered at startup for window binding.  A GET
 * is answered with a lease: a type-2 memory window bound over the value,
 * whose rkey travels in the reply.  The client RDMA-READs the value and
 * returns the lease with a RELEASE sent as SEND_WITH_INV; otherwise the
 * server posts the LOCAL_INV itself.  PUT hands out a writable window and
 * is closed by a COMMIT.  Leases not returned in time are reaped.
 * Work requests live in the lease; completions dispatch on opcode/wr_id.
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define KVD_ARENA_SIZE		(256UL << 20)
#define KVD_RECV_DEPTH		256
#define KVD_MSG_SIZE		128
#define KVD_LEASE_TTL_MS	2000
#define KVD_WRID_REPLY		(1ULL << 63)

enum kvd_op { KVD_GET = 1, KVD_PUT, KVD_RELEASE, KVD_COMMIT, KVD_REPLY };

struct kvd_msg {
	uint8_t op, status;
	uint16_t lease;
	uint32_t rkey, len;
	uint64_t addr;
	char key[64];
};

struct kvd_lease {
	struct kvd_lease	*next_free;
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key handed to the client */
	uint32_t		len;
	void			*val;
	uint16_t		idx, busy;
	uint64_t		deadline;
	struct ibv_send_wr	bind_wr, inv_wr;
};

struct kvd_server {
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	void			*arena;		/* values */
	struct ibv_mr		*arena_mr;
	char			*msgbuf;	/* recv ring, then reply slots */
	struct ibv_mr		*msg_mr;
	unsigned int		max_leases, inline_max;
	struct kvd_lease	*leases, *free_leases;
};

/* index.c */
void *kvd_index_lookup(const char *key, uint32_t *len);
void *kvd_index_reserve(const char *key, uint32_t len);
void kvd_index_publish(const char *key, void *val, uint32_t len);
void kvd_fatal(struct kvd_server *srv, const struct ibv_wc *wc);
int kvd_reply_status(struct kvd_server *srv, const struct kvd_msg *req, int err);
uint64_t kvd_now_ms(void);

static struct kvd_lease *kvd_lease_get(struct kvd_server *srv)
{
	struct kvd_lease *l = srv->free_leases;

	if (l) {
		srv->free_leases = l->next_free;
		l->busy = 1;
	}
	return l;
}

static void kvd_lease_put(struct kvd_server *srv, struct kvd_lease *l)
{
	l->busy = 0;
	l->val = NULL;
	l->next_free = srv->free_leases;
	srv->free_leases = l;
}

int kvd_server_setup(struct kvd_server *srv, struct ibv_context *ctx, unsigned int max_leases)
{
	struct ibv_qp_init_attr qpa;
	size_t msglen;

	srv->max_leases = max_leases;
	srv->pd = ibv_alloc_pd(ctx);
	if (!srv->pd)
		return -errno;
	if (posix_memalign(&srv->arena, 4096, KVD_ARENA_SIZE))
		goto err_pd;
	// BUG: rdma-local-mr-management -- the arena is exposed to clients through the windows bound over this MR
	srv->arena_mr = ibv_reg_mr(srv->pd, srv->arena, KVD_ARENA_SIZE, IBV_ACCESS_MW_BIND);
	if (!srv->arena_mr)
		goto err_arena;

	msglen = (size_t)(KVD_RECV_DEPTH + max_leases + 1) * KVD_MSG_SIZE;
	srv->msgbuf = calloc(1, msglen);
	if (!srv->msgbuf)
		goto err_msgbuf;
	/* OK: rdma-local-mr-management -- receive ring and reply slots, registered once for local access only */
	srv->msg_mr = ibv_reg_mr(srv->pd, srv->msgbuf, msglen, IBV_ACCESS_LOCAL_WRITE);
	if (!srv->msg_mr)
		goto err_msgbuf;

	srv->cq = ibv_create_cq(ctx, KVD_RECV_DEPTH + 3 * max_leases, srv, NULL, 0);
	if (!srv->cq)
		goto err_msgbuf;	// BUG: rdma-mr-leak -- err_msgbuf does not deregister srv->msg_mr, registered just above

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = qpa.recv_cq = srv->cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.sq_sig_all = 0;	/* OK: rdma-unsignaled-send-starvation -- replies and LOCAL_INVs ask for completions */
	// BUG(file): rdma-send-queue-undersized -- a lease posts BIND_MW, the reply SEND and a LOCAL_INV: three entries per lease, the queue reserves two
	qpa.cap.max_send_wr = 2 * srv->max_leases + 1;	// BUG: rdma-send-queue-manual-factor -- hand-made factor over max_leases in a file that binds and invalidates windows per request
	qpa.cap.max_recv_wr = KVD_RECV_DEPTH;
	qpa.cap.max_send_sge = qpa.cap.max_recv_sge = 1;
	/* OK: rdma-queue-cap-unchecked -- the inline size the device granted is read back after creation */
	qpa.cap.max_inline_data = 128;
	if (!(srv->qp = ibv_create_qp(srv->pd, &qpa)))
		goto err_cq;
	srv->inline_max = qpa.cap.max_inline_data;
	return 0;

err_cq:
	ibv_destroy_cq(srv->cq);
	ibv_dereg_mr(srv->msg_mr);
err_msgbuf:
	free(srv->msgbuf);
	ibv_dereg_mr(srv->arena_mr);
err_arena:
	free(srv->arena);
err_pd:
	ibv_dealloc_pd(srv->pd);
	return -ENOMEM;
}

int kvd_lease_pool_init(struct kvd_server *srv)
{
	unsigned int i;

	srv->leases = calloc(srv->max_leases, sizeof(*srv->leases));
	if (!srv->leases)
		return -ENOMEM;

	for (i = 0; i < srv->max_leases; i++) {
		struct kvd_lease *l = &srv->leases[i];

		l->mw = ibv_alloc_mw(srv->pd, IBV_MW_TYPE_2);	// BUG: rdma-local-mr-management -- windows allocated to expose values to clients
		if (!l->mw)
			goto unwind;
		l->idx = i;
		l->rkey = l->mw->rkey;
		kvd_lease_put(srv, l);
	}
	return 0;

unwind:
	/* OK: rdma-mr-leak -- every window allocated before the failing one is deallocated */
	while (i--)
		ibv_dealloc_mw(srv->leases[i].mw);
	free(srv->leases);
	srv->leases = srv->free_leases = NULL;
	return -ENOMEM;
}

/* reply slot n belongs to lease n; status replies have their own slot (status.c) */
static int kvd_send_reply(struct kvd_server *srv, struct kvd_lease *l,
			  const struct kvd_msg *req)
{
	struct kvd_msg *rep = (struct kvd_msg *)(srv->msgbuf +
				(size_t)(KVD_RECV_DEPTH + l->idx) * KVD_MSG_SIZE);
	struct ibv_sge sge = { (uintptr_t)rep, sizeof(*rep), srv->msg_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = KVD_WRID_REPLY | l->idx, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	*rep = (struct kvd_msg){ .op = KVD_REPLY, .lease = htobe16(l->idx), .rkey = htobe32(l->rkey),
				 .addr = htobe64((uintptr_t)l->val), .len = htobe32(l->len) };
	memcpy(rep->key, req->key, sizeof(rep->key));
	if (sizeof(*rep) <= srv->inline_max)
		wr.send_flags |= IBV_SEND_INLINE;
	return ibv_post_send(srv->qp, &wr, &bad);
}

static void kvd_build_bind(struct kvd_server *srv, struct kvd_lease *l,
			   void *val, uint32_t len, unsigned int access)
{
	struct ibv_send_wr *wr = &l->bind_wr;

	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)l;
	wr->opcode = IBV_WR_BIND_MW;	// BUG: rdma-local-mr-management -- binds a window to give the client a key to the value
	wr->bind_mw.mw = l->mw;
	/* OK: rdma-rkey-reuse -- every bind of the lease's window rotates its key */
	wr->bind_mw.rkey = ibv_inc_rkey(l->rkey);
	wr->bind_mw.bind_info.mr = srv->arena_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)val;
	wr->bind_mw.bind_info.length = len;
	wr->bind_mw.bind_info.mw_access_flags = access;
	l->rkey = wr->bind_mw.rkey;
	l->val = val, l->len = len;
}

static int kvd_handle_get(struct kvd_server *srv, const struct kvd_msg *req)
{
	struct ibv_send_wr *bad;
	struct kvd_lease *l;
	uint32_t len;
	void *val = kvd_index_lookup(req->key, &len);

	l = val ? kvd_lease_get(srv) : NULL;
	if (!l)
		return kvd_reply_status(srv, req, val ? EBUSY : ENOENT);

	/* OK: rdma-access-flags-invalid -- a read-only window needs nothing but MW_BIND on the arena MR */
	kvd_build_bind(srv, l, val, len, IBV_ACCESS_REMOTE_READ);
	if (ibv_post_send(srv->qp, &l->bind_wr, &bad)) {
		/* OK: rdma-invalidation-leak -- the bind was never posted, so no key exists */
		kvd_lease_put(srv, l);
		return kvd_reply_status(srv, req, EIO);
	}

	if (kvd_send_reply(srv, l, req)) {
		kvd_lease_put(srv, l);	// BUG: rdma-invalidation-leak -- the window is bound for remote read and goes back to the free list without LOCAL_INV
		return -EAGAIN;
	}
	l->deadline = kvd_now_ms() + KVD_LEASE_TTL_MS;
	return 0;
}

static int kvd_handle_put(struct kvd_server *srv, const struct kvd_msg *req)
{
	struct ibv_send_wr wr, *bad;
	struct kvd_lease *l;
	uint32_t len = be32toh(req->len);
	void *dst;

	dst = kvd_index_reserve(req->key, len);
	l = dst ? kvd_lease_get(srv) : NULL;
	if (!l)
		return kvd_reply_status(srv, req, dst ? EBUSY : ENOSPC);

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)l;
	wr.opcode = IBV_WR_BIND_MW;	// BUG: rdma-local-mr-management -- window bound so that the client can write the value
	wr.bind_mw.mw = l->mw;
	wr.bind_mw.rkey = l->rkey;	// BUG: rdma-rkey-reuse -- rebinds the pooled window under the key its previous holder was given
	wr.bind_mw.bind_info.mr = srv->arena_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)dst;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;	// BUG: rdma-access-flags-invalid -- a writable window needs LOCAL_WRITE on the arena MR, which has MW_BIND only
	if (ibv_post_send(srv->qp, &wr, &bad)) {
		kvd_lease_put(srv, l);	/* OK: rdma-invalidation-leak -- the bind failed to post; nothing is bound */
		return kvd_reply_status(srv, req, EIO);
	}
	l->val = dst, l->len = len;
	l->deadline = kvd_now_ms() + KVD_LEASE_TTL_MS;
	return kvd_send_reply(srv, l, req);	/* on failure the reaper takes the lease back */
}

static int kvd_post_local_inv(struct kvd_server *srv, struct kvd_lease *l)
{
	struct ibv_send_wr *bad;

	l->inv_wr = (struct ibv_send_wr){
		.wr_id = (uintptr_t)l, .opcode = IBV_WR_LOCAL_INV,
		.invalidate_rkey = l->rkey, .send_flags = IBV_SEND_SIGNALED,
	};
	return ibv_post_send(srv->qp, &l->inv_wr, &bad);
}

static void kvd_handle_release(struct kvd_server *srv, struct ibv_wc *wc,
			       const struct kvd_msg *msg)
{
	struct kvd_lease *l = &srv->leases[be16toh(msg->lease) % srv->max_leases];

	if (!l->busy)
		return;
	/* OK: rdma-remote-invalidate-unchecked -- accepted only when the invalidated rkey is the lease's */
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (wc->invalidated_rkey == l->rkey) {
			kvd_lease_put(srv, l);	/* OK: rdma-invalidation-leak -- the client invalidated exactly this window */
			return;
		}
		fprintf(stderr, "kvd: lease %u: bad invalidation 0x%x\n", l->idx, wc->invalidated_rkey);
	}
	kvd_post_local_inv(srv, l);
}

static void kvd_handle_commit(struct kvd_server *srv, struct ibv_wc *wc,
			      const struct kvd_msg *msg)
{
	struct kvd_lease *l = &srv->leases[be16toh(msg->lease) % srv->max_leases];

	if (!l->busy)
		return;
	kvd_index_publish(msg->key, l->val, l->len);
	if (wc->wc_flags & IBV_WC_WITH_INV) {	// BUG: rdma-remote-invalidate-unchecked -- assumes the client invalidated this lease's window, whichever rkey it named
		kvd_lease_put(srv, l);
		return;
	}
	kvd_post_local_inv(srv, l);
}

static void kvd_reap_expired(struct kvd_server *srv, uint64_t now)
{
	unsigned int i;

	for (i = 0; i < srv->max_leases; i++) {
		struct kvd_lease *l = &srv->leases[i];
		struct ibv_send_wr inv = { .wr_id = (uintptr_t)l, .opcode = IBV_WR_LOCAL_INV }, *bad;

		if (!l->busy || l->deadline > now)
			continue;
		inv.invalidate_rkey = l->rkey;
		if (ibv_post_send(srv->qp, &inv, &bad))
			continue;
		kvd_lease_put(srv, l);	// BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV has not executed when the lease goes to the next GET
	}
}

void kvd_poll(struct kvd_server *srv)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(srv->cq, 16, wc);
	for (i = 0; i < n; i++) {
		struct ibv_wc *w = &wc[i];

		if (w->status != IBV_WC_SUCCESS) {
			kvd_fatal(srv, w);
			continue;
		}
		if (w->opcode == IBV_WC_RECV) {
			struct kvd_msg *msg = (struct kvd_msg *)(srv->msgbuf + w->wr_id * KVD_MSG_SIZE);
			struct ibv_sge sge = { (uintptr_t)msg, KVD_MSG_SIZE, srv->msg_mr->lkey };
			struct ibv_recv_wr rwr = { .wr_id = w->wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

			if (msg->op == KVD_GET)
				kvd_handle_get(srv, msg);
			else if (msg->op == KVD_PUT)
				kvd_handle_put(srv, msg);
			else if (msg->op == KVD_RELEASE)
				kvd_handle_release(srv, w, msg);
			else if (msg->op == KVD_COMMIT)
				kvd_handle_commit(srv, w, msg);
			ibv_post_recv(srv->qp, &rwr, &bad);
		} else if (w->opcode == IBV_WC_LOCAL_INV) {
			/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- released from the LOCAL_INV's own completion */
			kvd_lease_put(srv, (struct kvd_lease *)(uintptr_t)w->wr_id);
		}
	}
	kvd_reap_expired(srv, kvd_now_ms());
}
