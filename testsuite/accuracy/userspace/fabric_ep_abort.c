/*
 * fabep: the RMA-target side of a libfabric-like endpoint.  fi_mr_reg-style
 * requests expose a user buffer through a type-2 window bound on the
 * endpoint's QP; the key goes back to the application, which sends it to
 * its peers.  fabep_mr_close() revokes the window: it posts a signaled
 * LOCAL_INV and polls the CQ for that completion before returning, after
 * which the application may free the buffer.
 *
 * The abort path (endpoint shutdown while registrations are open) was
 * written in a hurry: it posts the LOCAL_INV without a completion request
 * and frees the bounce copy right away, while the peer can still write
 * through the window.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FABEP_MAX_MR	256

struct fabep_mr {
	struct ibv_mw *mw;
	uint32_t       key;
	void          *buf;
	size_t         len;
	void          *bounce;	/* owned copy when the user asked for FI_MR_COPY */
	int            open;
};

struct fabep {
	struct ibv_pd   *pd;
	struct ibv_cq   *cq;
	struct ibv_qp   *qp;
	struct ibv_mr   *base_mr;	/* whole heap, LOCAL_WRITE | MW_BIND */
	struct fabep_mr  mrs[FABEP_MAX_MR];
};

static int fabep_wait_wr(struct fabep *ep, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(ep->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 1 && wc.wr_id == wr_id)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

int fabep_mr_reg(struct fabep *ep, void *buf, size_t len, int copy, uint64_t *key_out)
{
	struct fabep_mr *m = NULL;
	struct ibv_send_wr wr, *bad;
	int i;

	for (i = 0; i < FABEP_MAX_MR; i++)
		if (!ep->mrs[i].open) {
			m = &ep->mrs[i];
			break;
		}
	if (!m)
		return -ENOSPC;
	if (!m->mw) {
		m->mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!m->mw)
			return -errno;
		m->key = m->mw->rkey;
	}
	m->bounce = NULL;
	if (copy) {
		m->bounce = malloc(len);
		if (!m->bounce)
			return -ENOMEM;
		memcpy(m->bounce, buf, len);
	}
	m->buf = buf;
	m->len = len;
	m->key = ibv_inc_rkey(m->key);

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)m;
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds a window per registration request
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = m->mw;
	wr.bind_mw.rkey = m->key; /* OK: rdma-rkey-reuse -- rotated with ibv_inc_rkey() above */
	wr.bind_mw.bind_info.mr = ep->base_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)(copy ? m->bounce : buf);
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(ep->qp, &wr, &bad) || fabep_wait_wr(ep, (uintptr_t)m)) {
		free(m->bounce);
		m->bounce = NULL;
		return -EIO;
	}
	m->open = 1;
	*key_out = m->key;
	return 0;
}

int fabep_mr_close(struct fabep *ep, struct fabep_mr *m)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)m | 1;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = m->key;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(ep->qp, &wr, &bad))
		return -EIO;
	if (fabep_wait_wr(ep, (uintptr_t)m | 1))
		return -EIO;
	m->open = 0;
	/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completion was polled for above */
	free(m->bounce);
	m->bounce = NULL;
	return 0;
}

void fabep_abort(struct fabep *ep)
{
	struct ibv_send_wr wr, *bad;
	int i;

	for (i = 0; i < FABEP_MAX_MR; i++) {
		struct fabep_mr *m = &ep->mrs[i];

		if (!m->open)
			continue;
		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_LOCAL_INV;
		wr.invalidate_rkey = m->key;
		ibv_post_send(ep->qp, &wr, &bad);
		m->open = 0;
		// BUG: rdma-unmap-before-invalidate -- freed right after posting an unsignaled LOCAL_INV
		free(m->bounce);
		m->bounce = NULL;
	}
}
