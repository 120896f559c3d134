// RUN: %check_ulplint --kernel %s rdma-mr-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-mr-leak %t.plugin

// Kernel MR handling with error unwinding.

#include <rdma/mr_pool.h>
#include <linux/list.h>
#include <linux/slab.h>

#define WARN_ON_ONCE_DEMO(condition) ({ int __ret_warn_on = !!(condition); \
	if (unlikely(__ret_warn_on)) demo_warn(); unlikely(__ret_warn_on); })
void demo_warn(void);

struct demo_queue {
	struct ib_qp *qp;
	struct ib_pd *pd;
};

struct demo_req {
	struct ib_mr *mr;
	struct scatterlist *sgl;
	int nents;
};

struct demo_dev {
	struct ib_mr *scratch_mr;
	struct ib_mr *sig_mr;
};

/* The map error path forgets to put the MR back. */
static int demo_map_sg(struct demo_queue *q, struct demo_req *req)
{
	int nr;

	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (WARN_ON_ONCE_DEMO(!req->mr))
		return -EAGAIN;
	nr = ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K);
	if (unlikely(nr < req->nents))
		return -EINVAL;
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory region from 'ib_mr_pool_get' (held in demo_req.mr); it leaks [rdma-mr-leak]
	// CHECK-MESSAGES: :[[@LINE-7]]:12: note: memory region obtained here
	// CHECK-MESSAGES: :[[@LINE-4]]:2: note: error path taken here
	return 0;
}

static void demo_unmap(struct demo_queue *q, struct demo_req *req)
{
	ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
	req->mr = NULL;
}

/* Goto unwinding that skips one label. */
static int demo_dev_init(struct demo_dev *dev, struct ib_pd *pd)
{
	int ret;

	dev->scratch_mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, 16);
	if (!dev->scratch_mr)
		return -ENOMEM;
	dev->sig_mr = ib_alloc_mr(pd, IB_MR_TYPE_INTEGRITY, 16);
	if (!dev->sig_mr) {
		ret = -ENOMEM;
		goto out;
	}
	return 0;
out:
	return ret;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: error path returns without releasing the memory region from 'ib_alloc_mr' (held in demo_dev.scratch_mr); it leaks
	// CHECK-MESSAGES: :[[@LINE-12]]:20: note: memory region obtained here
}

static void demo_dev_exit(struct demo_dev *dev)
{
	ib_dereg_mr(dev->sig_mr);
	ib_dereg_mr(dev->scratch_mr);
}

/* Near miss: nvme-rdma puts the MR back on its error path. */
static int ok_map_sg(struct demo_queue *q, struct demo_req *req)
{
	int nr;

	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (WARN_ON_ONCE_DEMO(!req->mr))
		return -EAGAIN;
	nr = ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K);
	if (unlikely(nr < req->nents)) {
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return -EINVAL;
	}
	return 0;
}

/* Near miss: ib_mr_pool_init()'s shape. Each MR goes onto the pool's list
 * through its own list node; the list keeps it. */
struct demo_pool_owner {
	struct ib_pd *pd;
	struct list_head free_mrs;
};

static int demo_pool_fill(struct demo_pool_owner *o, int nr)
{
	struct ib_mr *mr;
	int i;

	for (i = 0; i < nr; i++) {
		mr = ib_alloc_mr(o->pd, IB_MR_TYPE_MEM_REG, 16);
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		list_add_tail(&mr->qp_entry, &o->free_mrs);
	}
	return 0;
}

/* Near miss: the MR array is allocated before its MRs, unwound in a loop
 * and freed; the path where allocating the arrays failed frees an array
 * that holds nothing yet. */
struct demo_hdr_queue {
	struct ib_pd *pd;
	struct ib_mr **hdr_mrs;
	void **hdr_bufs;
	int nr;
};

int demo_alloc_hdr_mrs(struct demo_hdr_queue *q)
{
	int i, ret;

	q->hdr_mrs = kcalloc(q->nr, sizeof(*q->hdr_mrs), GFP_KERNEL);
	q->hdr_bufs = kcalloc(q->nr, sizeof(*q->hdr_bufs), GFP_KERNEL);
	if (!q->hdr_mrs || !q->hdr_bufs) {
		ret = -ENOMEM;
		goto out_free_arrays;
	}
	for (i = 0; i < q->nr; i++) {
		q->hdr_mrs[i] = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, 1);
		if (IS_ERR(q->hdr_mrs[i])) {
			ret = PTR_ERR(q->hdr_mrs[i]);
			goto out_unwind;
		}
		q->hdr_bufs[i] = kmalloc(512, GFP_KERNEL);
		if (!q->hdr_bufs[i]) {
			ib_dereg_mr(q->hdr_mrs[i]);
			ret = -ENOMEM;
			goto out_unwind;
		}
	}
	return 0;

out_unwind:
	while (--i >= 0) {
		kfree(q->hdr_bufs[i]);
		ib_dereg_mr(q->hdr_mrs[i]);
	}
out_free_arrays:
	kfree(q->hdr_bufs);
	kfree(q->hdr_mrs);
	return ret;
}

// A channel's ring MR: set up by a helper that unwinds itself (it
// deregisters the MR when mapping fails), so the post failure that jumps
// past its deregistration is the helper's leak, not its caller's. The
// channel's teardown releases the MR; the caller unwinds only what it set
// up itself.
struct ring_ch {
	struct ib_pd *pd;
	struct ib_qp *qp;
	struct ib_mr *ring_mr;
	struct scatterlist ring_sg;
	struct ib_reg_wr ring_reg_wr;
	void *ring_buf;
};

static int ring_alloc(struct ring_ch *ch, size_t len)
{
	int ret;

	ch->ring_buf = kzalloc(len, GFP_KERNEL);
	if (!ch->ring_buf)
		return -ENOMEM;
	ch->ring_mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, 8);
	if (IS_ERR(ch->ring_mr)) {
		ret = PTR_ERR(ch->ring_mr);
		goto out_free;
	}
	if (ib_map_mr_sg(ch->ring_mr, &ch->ring_sg, 1, NULL, 4096) != 1) {
		ret = -EINVAL;
		goto out_dereg;
	}
	ch->ring_reg_wr.wr.opcode = IB_WR_REG_MR;
	ch->ring_reg_wr.mr = ch->ring_mr;
	ch->ring_reg_wr.key = ch->ring_mr->rkey;
	ch->ring_reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	ret = ib_post_send(ch->qp, &ch->ring_reg_wr.wr, NULL);
	if (ret)
		goto out_free;
	return 0;

out_dereg:
	ib_dereg_mr(ch->ring_mr);
out_free:
	kfree(ch->ring_buf);
	return ret;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: error path returns without releasing the memory region from 'ib_alloc_mr' (held in ring_ch.ring_mr); it leaks [rdma-mr-leak]
	// CHECK-MESSAGES: :[[@LINE-24]]:16: note: memory region obtained here
	// CHECK-MESSAGES: :[[@LINE-11]]:2: note: error path taken here
}

void ring_destroy(struct ring_ch *ch)
{
	ib_dereg_mr(ch->ring_mr);
	kfree(ch->ring_buf);
}

int ring_create(struct ring_ch *ch)
{
	int ret = ring_alloc(ch, 4096);

	if (ret)
		return ret;
	return 0;
}
