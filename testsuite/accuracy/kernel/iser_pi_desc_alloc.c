// SPDX-License-Identifier: GPL-2.0-only
/*
 * isx: fast-registration descriptors of an iSCSI-over-RDMA initiator with
 * T10-PI support, in the shape of drivers/infiniband/ulp/iser/iser_verbs.c
 * of the Linux 4.x series (iser_alloc_reg_res, iser_alloc_pi_ctx,
 * iser_create_fastreg_desc, iser_alloc_fastreg_pool). Written fresh for
 * the held-out batch.
 *
 * Every descriptor owns a data MR; with protection information it also
 * owns a PI context with a second MR for the protection buffer. The pool
 * is filled once when the connection is set up and torn down with it.
 *
 * The defect is in isx_create_fastreg_desc(): when the PI context cannot
 * be allocated the error path jumps over the label that releases the data
 * MR and frees the descriptor with the MR still in it. isx_alloc_pi_ctx()
 * shows the correct ladder, and isx_alloc_fastreg_pool() unwinds through
 * isx_free_fastreg_pool(), which releases every MR of every descriptor
 * already on the pool's all_list.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <rdma/ib_verbs.h>

struct isx_reg_resources {
	struct ib_mr		*mr;
	u8			mr_valid:1;
};

struct isx_pi_context {
	struct isx_reg_resources rsc;
	u8			sig_protected:1;
};

struct isx_fr_desc {
	struct list_head	list;
	struct list_head	all_list;
	struct isx_reg_resources rsc;
	struct isx_pi_context	*pi_ctx;
	bool			pi_enable;
};

struct isx_fr_pool {
	struct list_head	list;
	struct list_head	all_list;
	spinlock_t		lock;
	int			size;
};

struct isx_device {
	struct ib_device	*ib_device;
	struct ib_pd		*pd;
	enum ib_mr_type		mr_type;
};

struct isx_ib_conn {
	struct isx_device	*device;
	struct isx_fr_pool	fr_pool;
	bool			pi_support;
};

static int isx_alloc_reg_res(struct isx_device *device, struct ib_pd *pd,
			     struct isx_reg_resources *res, unsigned int size)
{
	int ret;

	/* BUG: rdma-local-mr-management -- the ULP allocates its own fast-registration MRs */
	res->mr = ib_alloc_mr(pd, device->mr_type, size);
	if (IS_ERR(res->mr)) {
		ret = PTR_ERR(res->mr);
		pr_err("Failed to allocate ib_fast_reg_mr err=%d\n", ret);
		return ret;
	}
	res->mr_valid = 0;
	return 0;
}

static void isx_free_reg_res(struct isx_reg_resources *rsc)
{
	ib_dereg_mr(rsc->mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
}

static int isx_alloc_pi_ctx(struct isx_device *device, struct ib_pd *pd,
			    struct isx_fr_desc *desc, unsigned int size)
{
	struct isx_pi_context *pi_ctx;
	int ret;

	desc->pi_ctx = kzalloc(sizeof(*desc->pi_ctx), GFP_KERNEL);
	if (!desc->pi_ctx)
		return -ENOMEM;
	pi_ctx = desc->pi_ctx;

	ret = isx_alloc_reg_res(device, pd, &pi_ctx->rsc, size);
	if (ret) {
		pr_err("failed to allocate prot frpl ret=%d\n", ret);
		goto prot_mr_failure;
	}

	pi_ctx->sig_protected = 0;
	desc->pi_enable = true;
	return 0;

prot_mr_failure:
	/* OK: rdma-mr-leak -- the protection MR was not allocated; only the context is freed */
	kfree(desc->pi_ctx);
	desc->pi_ctx = NULL;
	return ret;
}

static void isx_free_pi_ctx(struct isx_pi_context *pi_ctx)
{
	isx_free_reg_res(&pi_ctx->rsc);
	kfree(pi_ctx);
}

static struct isx_fr_desc *
isx_create_fastreg_desc(struct isx_device *device, struct ib_pd *pd,
			bool pi_enable, unsigned int size)
{
	struct isx_fr_desc *desc;
	int ret;

	desc = kzalloc(sizeof(*desc), GFP_KERNEL);
	if (!desc)
		return ERR_PTR(-ENOMEM);

	ret = isx_alloc_reg_res(device, pd, &desc->rsc, size);
	if (ret)
		goto reg_res_alloc_failure;

	if (size > device->ib_device->attrs.max_fast_reg_page_list_len) {
		ret = -EINVAL;
		goto pi_ctx_alloc_failure;
	}

	if (pi_enable) {
		ret = isx_alloc_pi_ctx(device, pd, desc, size);
		if (ret)
			/* BUG: rdma-mr-leak -- jumps past isx_free_reg_res(): the descriptor is freed with its data MR still allocated */
			goto reg_res_alloc_failure;
	}

	return desc;

pi_ctx_alloc_failure:
	isx_free_reg_res(&desc->rsc);
reg_res_alloc_failure:
	kfree(desc);
	return ERR_PTR(ret);
}

/**
 * isx_free_fastreg_pool - release every descriptor of the connection
 * @ib_conn: the connection
 */
void isx_free_fastreg_pool(struct isx_ib_conn *ib_conn)
{
	struct isx_fr_pool *fr_pool = &ib_conn->fr_pool;
	struct isx_fr_desc *desc, *tmp;
	int i = 0;

	if (list_empty(&fr_pool->all_list))
		return;

	list_for_each_entry_safe(desc, tmp, &fr_pool->all_list, all_list) {
		list_del(&desc->all_list);
		isx_free_reg_res(&desc->rsc);
		if (desc->pi_ctx)
			isx_free_pi_ctx(desc->pi_ctx);
		kfree(desc);
		++i;
	}

	if (i < fr_pool->size)
		pr_warn("pool still has %d regions registered\n",
			fr_pool->size - i);
}

/**
 * isx_alloc_fastreg_pool - fill the connection's descriptor pool
 * @ib_conn: the connection
 * @cmds_max: commands the session may have in flight
 * @size: pages per registration
 */
int isx_alloc_fastreg_pool(struct isx_ib_conn *ib_conn, unsigned int cmds_max,
			   unsigned int size)
{
	struct isx_device *device = ib_conn->device;
	struct isx_fr_pool *fr_pool = &ib_conn->fr_pool;
	struct isx_fr_desc *desc;
	unsigned int i;
	int ret;

	INIT_LIST_HEAD(&fr_pool->list);
	INIT_LIST_HEAD(&fr_pool->all_list);
	spin_lock_init(&fr_pool->lock);
	fr_pool->size = 0;

	for (i = 0; i < cmds_max; i++) {
		desc = isx_create_fastreg_desc(device, device->pd,
					       ib_conn->pi_support, size);
		if (IS_ERR(desc)) {
			ret = PTR_ERR(desc);
			goto err;
		}

		list_add_tail(&desc->list, &fr_pool->list);
		list_add_tail(&desc->all_list, &fr_pool->all_list);
		fr_pool->size++;
	}
	return 0;

err:
	/* OK: rdma-mr-leak -- every descriptor created so far is on all_list and released by the pool teardown */
	isx_free_fastreg_pool(ib_conn);
	return ret;
}

/* Descriptors are taken per command and put back after invalidation. */
struct isx_fr_desc *isx_reg_desc_get_fr(struct isx_ib_conn *ib_conn)
{
	struct isx_fr_pool *fr_pool = &ib_conn->fr_pool;
	struct isx_fr_desc *desc;

	spin_lock(&fr_pool->lock);
	desc = list_first_entry_or_null(&fr_pool->list, struct isx_fr_desc,
					list);
	if (desc)
		list_del(&desc->list);
	spin_unlock(&fr_pool->lock);
	return desc;
}
