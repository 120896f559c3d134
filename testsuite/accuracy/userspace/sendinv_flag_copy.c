/*
 * blkc2: a second-generation block client.  The completion handler
 * classifies each response into a small event record (status, whether the
 * target invalidated remotely, the invalidated key) that the I/O state
 * machine consumes later.
 *
 * The write path's state machine checks the saved invalidated key against
 * the I/O's window key before skipping its LOCAL_INV.  The read path was
 * written separately and only looks at the saved boolean, so whatever key
 * the target invalidated, a read I/O considers its own window dead.
 */
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

struct blkc2_ev {
	int      status;
	bool     remote_inv;
	uint32_t inv_rkey;
};

struct blkc2_io {
	uint32_t key;
	bool     window_live;
	bool     is_write;
	void   (*complete)(struct blkc2_io *, int);
};

void blkc2_post_local_inv(struct blkc2_io *io);

void blkc2_classify(const struct ibv_wc *wc, struct blkc2_ev *ev)
{
	ev->status = wc->status == IBV_WC_SUCCESS ? 0 : -1;
	ev->remote_inv = (wc->wc_flags & IBV_WC_WITH_INV) != 0;
	ev->inv_rkey = wc->invalidated_rkey;
}

void blkc2_write_done(struct blkc2_io *io, const struct blkc2_ev *ev)
{
	/* OK: rdma-remote-invalidate-unchecked -- the saved key is compared with the I/O's */
	if (ev->remote_inv && ev->inv_rkey == io->key) {
		io->window_live = false;
		io->complete(io, ev->status);
		return;
	}
	blkc2_post_local_inv(io);
}

void blkc2_read_done(struct blkc2_io *io, const struct blkc2_ev *ev)
{
	// BUG: rdma-remote-invalidate-unchecked -- the saved WITH_INV flag is trusted; ev->inv_rkey is never compared with io->key
	if (ev->remote_inv) {
		io->window_live = false;
		io->complete(io, ev->status);
		return;
	}
	blkc2_post_local_inv(io);
}
