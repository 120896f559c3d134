/*
 * segsrv: a shared-segment server.  One large segment is registered once;
 * every client gets its own slice, exposed through a type-1 memory window
 * bound with ibv_bind_mw() on that client's QP, and learns the window's
 * rkey in the accept reply.  When a client leaves, its window is unbound
 * with a zero-length bind before the slice is handed to the next client;
 * a client that reconnects gets its slice rebound (type-1 binds get a new
 * key from the provider on every bind).
 *
 * Not correct: the segment MR was registered with the flags of the old
 * pre-window version of this server -- it still grants remote read/write
 * through its own rkey (which nobody needs: the windows carry the access)
 * and lacks IBV_ACCESS_MW_BIND, so every ibv_bind_mw() fails.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEG_SLICE	(1u << 20)
#define SEG_CLIENTS	16

#define SEG_OLD_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | \
			 IBV_ACCESS_REMOTE_WRITE)

struct seg_client {
	struct ibv_qp *qp;
	struct ibv_mw *mw;
	int            slice;
	int            bound;
};

struct seg_server {
	struct ibv_pd     *pd;
	char              *seg;
	struct ibv_mr     *seg_mr;
	unsigned long      slice_busy;
	struct seg_client  clients[SEG_CLIENTS];
};

struct seg_accept_reply {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

int seg_server_init(struct seg_server *s, struct ibv_pd *pd)
{
	memset(s, 0, sizeof(*s));
	s->pd = pd;
	s->seg = aligned_alloc(4096, (size_t)SEG_SLICE * SEG_CLIENTS);
	if (!s->seg)
		return -ENOMEM;
	// BUG: rdma-remote-access-overbroad -- the segment's own rkey is never sent; the windows carry the remote access
	s->seg_mr = ibv_reg_mr(pd, s->seg, (size_t)SEG_SLICE * SEG_CLIENTS, SEG_OLD_ACCESS);
	if (!s->seg_mr) {
		free(s->seg);
		return -errno;
	}
	return 0;
}

static int seg_bind(struct seg_server *s, struct seg_client *c, size_t len,
		    unsigned int access)
{
	struct ibv_mw_bind bind;

	memset(&bind, 0, sizeof(bind));
	bind.wr_id = (uintptr_t)c;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info.mr = len ? s->seg_mr : NULL;
	bind.bind_info.addr = len ? (uintptr_t)(s->seg + (size_t)c->slice * SEG_SLICE) : 0;
	bind.bind_info.length = len;
	bind.bind_info.mw_access_flags = access;
	/* OK: rdma-rkey-reuse -- type-1 bind: the provider assigns the window a new key */
	// BUG: rdma-access-flags-invalid -- seg_mr was registered without IBV_ACCESS_MW_BIND; the bind fails
	return ibv_bind_mw(c->qp, c->mw, &bind); // BUG: rdma-local-mr-management -- the ULP binds windows itself to expose memory
}

static int seg_wait_bind(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

int seg_accept(struct seg_server *s, struct ibv_qp *qp, struct ibv_cq *cq,
	       struct seg_accept_reply *reply)
{
	struct seg_client *c = NULL;
	int i;

	for (i = 0; i < SEG_CLIENTS; i++) {
		if (!(s->slice_busy & (1ul << i))) {
			c = &s->clients[i];
			c->slice = i;
			break;
		}
	}
	if (!c)
		return -EBUSY;
	c->qp = qp;
	if (!c->mw) {
		c->mw = ibv_alloc_mw(s->pd, IBV_MW_TYPE_1); // BUG: rdma-local-mr-management -- the ULP allocates windows to expose memory
		if (!c->mw)
			return -errno;
	}
	if (seg_bind(s, c, SEG_SLICE, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE) ||
	    seg_wait_bind(cq)) {
		/* OK: rdma-mr-leak -- the window stays on the client slot and is reused or freed in seg_server_fini() */
		return -EIO;
	}
	c->bound = 1;
	s->slice_busy |= 1ul << c->slice;
	reply->addr = (uintptr_t)(s->seg + (size_t)c->slice * SEG_SLICE);
	reply->rkey = c->mw->rkey;
	reply->len = SEG_SLICE;
	return 0;
}

int seg_release(struct seg_server *s, struct seg_client *c, struct ibv_cq *cq)
{
	/* zero-length bind: the window no longer grants anything */
	if (seg_bind(s, c, 0, 0) || seg_wait_bind(cq)) {
		/* could not unbind: drop the window instead of reusing the slice */
		ibv_dealloc_mw(c->mw);
		c->mw = NULL;
	}
	c->bound = 0;
	/* OK: rdma-invalidation-leak -- the window was unbound (or deallocated) before the slice is reused */
	memset(s->seg + (size_t)c->slice * SEG_SLICE, 0, SEG_SLICE);
	s->slice_busy &= ~(1ul << c->slice);
	return 0;
}

void seg_server_fini(struct seg_server *s)
{
	int i;

	for (i = 0; i < SEG_CLIENTS; i++)
		if (s->clients[i].mw)
			ibv_dealloc_mw(s->clients[i].mw);
	ibv_dereg_mr(s->seg_mr);
	free(s->seg);
}
