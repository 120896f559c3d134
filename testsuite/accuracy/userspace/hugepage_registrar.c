/*
 * hpreg: registers the application's hugepage heap with every open RDMA
 * device.  The heap grows in 1 GiB extents; on each growth event the
 * memory manager calls hpreg_heap_grown(), which registers the new extent
 * on every device (a devices x extents table), unwinding the devices
 * already done when one fails.  Keys are exported through
 * hpreg_export_keys() for the wire protocol.  This runs from the memory
 * manager, never from the I/O path.
 *
 * Not correct: hpreg_extent_resize() (an extent can be extended in place
 * when the adjacent virtual range is free) registers the larger range and
 * stores it over the old MR without deregistering it.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#define HP_MAX_DEV	4
#define HP_MAX_EXT	64
#define HP_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

struct hp_extent {
	void          *base;
	size_t         len;
	struct ibv_mr *mr[HP_MAX_DEV];
};

struct hpreg {
	int              ndev;
	struct ibv_pd   *pd[HP_MAX_DEV];
	int              next;
	struct hp_extent ext[HP_MAX_EXT];
};

int hpreg_heap_grown(struct hpreg *h, void *base, size_t len)
{
	struct hp_extent *e;
	int n;

	if (h->next == HP_MAX_EXT)
		return -ENOSPC;
	e = &h->ext[h->next];
	for (n = 0; n < h->ndev; n++) {
		/* OK: rdma-registration-in-datapath -- heap growth, called by the memory manager */
		if (!(e->mr[n] = ibv_reg_mr(h->pd[n], base, len, HP_ACCESS))) // BUG: rdma-local-mr-management -- keys exported to peers
			goto undo;
	}
	e->base = base;
	e->len = len;
	h->next++;
	return 0;
undo:
	/* OK: rdma-mr-leak -- registrations on the devices before the failing one are undone */
	while (n--) {
		ibv_dereg_mr(e->mr[n]);
		e->mr[n] = NULL;
	}
	return -ENOMEM;
}

int hpreg_extent_resize(struct hpreg *h, int idx, size_t new_len)
{
	struct hp_extent *e = &h->ext[idx];
	int n;

	for (n = 0; n < h->ndev; n++) {
		struct ibv_mr *mr = ibv_reg_mr(h->pd[n], e->base, new_len, HP_ACCESS); // BUG: rdma-local-mr-management -- keys exported to peers

		if (!mr)
			return -errno;
		e->mr[n] = mr; // BUG: rdma-mr-leak -- the extent's previous MR on this device is overwritten without ibv_dereg_mr()
	}
	e->len = new_len;
	return 0;
}

int hpreg_export_keys(const struct hpreg *h, int dev, uint64_t *addrs, uint32_t *rkeys, int max)
{
	int i;

	for (i = 0; i < h->next && i < max; i++) {
		addrs[i] = (uintptr_t)h->ext[i].base;
		rkeys[i] = h->ext[i].mr[dev]->rkey;
	}
	return i;
}
