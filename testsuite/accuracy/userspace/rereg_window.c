/*
 * rxwin: a growable receive window exposed to a peer for RDMA WRITE.  The
 * window starts small; when the peer asks for more room the window is
 * moved to a larger buffer with ibv_rereg_mr() (translation and access
 * changed in one call, the rkey is re-announced).  When traffic drops the
 * window is shrunk in place with a translation-only rereg.
 *
 * Not correct: the grow path passes new access flags with remote
 * read/write but no local write -- the rereg fails with EINVAL (and with
 * IBV_REREG_MR_CHANGE_ACCESS the caller keeps using the old window).
 * Correct: the initial registration and the shrink path.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct rxwin {
	struct ibv_pd *pd;
	char          *buf;
	size_t         len;
	struct ibv_mr *mr;
};

struct rxwin_desc {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

static void rxwin_describe(const struct rxwin *w, struct rxwin_desc *d)
{
	d->addr = (uintptr_t)w->buf;
	d->rkey = w->mr->rkey;
	d->len = (uint32_t)w->len;
}

int rxwin_init(struct rxwin *w, size_t len, struct rxwin_desc *d)
{
	w->buf = aligned_alloc(4096, len);
	if (!w->buf)
		return -ENOMEM;
	w->len = len;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE with REMOTE_WRITE */
	w->mr = ibv_reg_mr(w->pd, w->buf, len, // BUG: rdma-local-mr-management -- rkey handed to the peer
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!w->mr) {
		free(w->buf);
		return -errno;
	}
	rxwin_describe(w, d);
	return 0;
}

int rxwin_grow(struct rxwin *w, size_t new_len, struct rxwin_desc *d)
{
	char *nbuf = aligned_alloc(4096, new_len);
	int ret;

	if (!nbuf)
		return -ENOMEM;
	memcpy(nbuf, w->buf, w->len);
	// BUG: rdma-access-flags-invalid -- new access has REMOTE_WRITE without IBV_ACCESS_LOCAL_WRITE
	/* OK: rdma-local-mr-management -- a rereg of the MR reported at its registration, not a new site */
	ret = ibv_rereg_mr(w->mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS,
			   w->pd, nbuf, new_len,
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (ret) {
		free(nbuf);
		return -EINVAL;
	}
	/* OK: rdma-invalidation-leak -- rereg moved the MR (and its key) off the old buffer before it is freed */
	free(w->buf);
	w->buf = nbuf;
	w->len = new_len;
	rxwin_describe(w, d);
	return 0;
}

int rxwin_shrink(struct rxwin *w, size_t new_len, struct rxwin_desc *d)
{
	int ret;

	if (new_len >= w->len)
		return 0;
	/* OK: rdma-access-flags-invalid -- valid flags (and ignored without CHANGE_ACCESS) */
	ret = ibv_rereg_mr(w->mr, IBV_REREG_MR_CHANGE_TRANSLATION, w->pd, w->buf, new_len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (ret)
		return -EIO;
	w->len = new_len;
	rxwin_describe(w, d);
	return 0;
}

void rxwin_fini(struct rxwin *w)
{
	ibv_dereg_mr(w->mr);
	free(w->buf);
}
