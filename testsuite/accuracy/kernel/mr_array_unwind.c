// SPDX-License-Identifier: GPL-2.0
/*
 * vxs: per-queue MR arrays of an invented video-streaming export ("vxs")
 * that sends frames to a remote renderer. Each queue owns nr_slots MRs and
 * a page array per MR; setup allocates both in one loop and unwinds with
 * "while (--i >= 0)".
 *
 * The bug is the classic off-by-one: when the page array of slot i cannot be
 * allocated, the MR of slot i has already been stored, but the unwinding loop
 * starts at i - 1, so that MR leaks. The ib_alloc_mr() failure of slot i is
 * handled right (nothing to free for that slot), the second setup function
 * frees the current slot before unwinding, and teardown releases every MR.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

struct vxs_slot {
	struct ib_mr	*mr;
	u64		*pages;
};

struct vxs_queue {
	struct ib_pd		*pd;
	int			nr_slots;
	u32			max_pages;
	struct vxs_slot		*slots;
	struct ib_mr		**hdr_mrs;
	void			**hdr_bufs;
};

int vxs_alloc_slots(struct vxs_queue *q)
{
	int i, ret;

	q->slots = kcalloc(q->nr_slots, sizeof(*q->slots), GFP_KERNEL);
	if (!q->slots)
		return -ENOMEM;

	for (i = 0; i < q->nr_slots; i++) {
		/* BUG: rdma-local-mr-management -- the export allocates its own FR MRs */
		q->slots[i].mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG,
					     q->max_pages); /* OK: rdma-registration-in-datapath -- queue setup */
		if (IS_ERR(q->slots[i].mr)) {
			ret = PTR_ERR(q->slots[i].mr);
			goto out_unwind; /* OK: rdma-mr-leak -- slot i holds no MR, the loop below frees slots 0..i-1 */
		}
		q->slots[i].pages = kcalloc(q->max_pages, sizeof(u64),
					    GFP_KERNEL);
		if (!q->slots[i].pages) {
			ret = -ENOMEM;
			goto out_unwind; /* BUG: rdma-mr-leak -- slot i's MR is already allocated but the unwinding starts at i - 1 */
		}
	}
	return 0;

out_unwind:
	while (--i >= 0) {
		kfree(q->slots[i].pages);
		/* BUG: rdma-local-mr-management -- the export deregisters its MRs */
		ib_dereg_mr(q->slots[i].mr);
	}
	kfree(q->slots);
	q->slots = NULL;
	return ret;
}

int vxs_alloc_hdr_mrs(struct vxs_queue *q)
{
	int i, ret;

	q->hdr_mrs = kcalloc(q->nr_slots, sizeof(*q->hdr_mrs), GFP_KERNEL);
	q->hdr_bufs = kcalloc(q->nr_slots, sizeof(*q->hdr_bufs), GFP_KERNEL);
	if (!q->hdr_mrs || !q->hdr_bufs) {
		ret = -ENOMEM;
		goto out_free_arrays;
	}

	for (i = 0; i < q->nr_slots; i++) {
		/* BUG: rdma-local-mr-management -- the export allocates its own FR MRs */
		q->hdr_mrs[i] = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, 1);
		if (IS_ERR(q->hdr_mrs[i])) {
			ret = PTR_ERR(q->hdr_mrs[i]);
			goto out_unwind;
		}
		q->hdr_bufs[i] = kmalloc(512, GFP_KERNEL);
		if (!q->hdr_bufs[i]) {
			/* BUG: rdma-local-mr-management -- the export deregisters its MR */
			ib_dereg_mr(q->hdr_mrs[i]); /* OK: rdma-mr-leak -- the current slot's MR is released before the older ones are unwound */
			ret = -ENOMEM;
			goto out_unwind;
		}
	}
	return 0;

out_unwind:
	while (--i >= 0) {
		kfree(q->hdr_bufs[i]);
		/* BUG: rdma-local-mr-management -- the export deregisters its MRs */
		ib_dereg_mr(q->hdr_mrs[i]);
	}
out_free_arrays:
	kfree(q->hdr_bufs);
	kfree(q->hdr_mrs);
	return ret;
}

void vxs_free_queue(struct vxs_queue *q)
{
	int i;

	for (i = 0; i < q->nr_slots; i++) {
		kfree(q->slots[i].pages);
		/* BUG: rdma-local-mr-management -- the export deregisters its MRs */
		ib_dereg_mr(q->slots[i].mr); /* OK: rdma-mr-leak -- teardown releases every slot's MR */
		kfree(q->hdr_bufs[i]);
		/* BUG: rdma-local-mr-management -- the export deregisters its MRs */
		ib_dereg_mr(q->hdr_mrs[i]);
	}
	kfree(q->slots);
	kfree(q->hdr_bufs);
	kfree(q->hdr_mrs);
}
