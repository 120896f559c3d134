// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * rtrsx-clt: per-path request allocation of an RDMA transport client, in
 * the shape of drivers/infiniband/ulp/rtrs/rtrs-clt.c alloc_path_reqs() and
 * free_path_reqs(). Written fresh for the held-out batch.
 *
 * Every request slot of a path owns an MR for fast registration, allocated
 * when the path is set up; an allocation failure unwinds through
 * free_path_reqs(), which deregisters the MR of every slot that got one.
 *
 * The defect is in rtrsx_clt_resize_req_mrs(), a helper this client added
 * for reconnects to a server that advertises a different max_io_size
 * (upstream frees and reallocates all requests instead): it allocates a
 * new MR for each slot and stores it over the old one, which nothing
 * deregisters any more.
 *
 * rtrsx_map_sg_fr()/rtrsx_clt_build_reg() follow rtrs_map_sg_fr() and the
 * registration part of rtrs_clt_read_req(): the key is advanced with
 * ib_inc_rkey() after every map, and the rkey goes to the server in the
 * request's descriptor.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <linux/string.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct rtrsx_ib_dev {
	struct ib_device	*ib_dev;
	struct ib_pd		*ib_pd;
};

struct rtrsx_clt_io_req {
	struct ib_mr		*mr;
	struct ib_sge		*sge;
	void			*iu;
	struct completion	inv_comp;
	bool			in_use;
	struct scatterlist	*sglist;
	unsigned int		sg_cnt;
	bool			need_inv;
};

struct rtrsx_sg_desc {
	__le64	addr;
	__le32	key;
	__le32	len;
};

struct rtrsx_clt_path {
	struct rtrsx_ib_dev	*dev;
	struct rtrsx_clt_io_req	*reqs;
	unsigned int		queue_depth;
	unsigned int		max_pages_per_mr;
	size_t			max_hdr_size;
};

static void rtrsx_free_path_reqs(struct rtrsx_clt_path *clt_path)
{
	struct rtrsx_clt_io_req *req;
	unsigned int i;

	if (!clt_path->reqs)
		return;
	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		if (req->mr)
			ib_dereg_mr(req->mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		kfree(req->sge);
		kfree(req->iu);
	}
	kfree(clt_path->reqs);
	clt_path->reqs = NULL;
}

/**
 * rtrsx_alloc_path_reqs - allocate the request slots of a path
 * @clt_path: the path, queue_depth and max_pages_per_mr already negotiated
 */
int rtrsx_alloc_path_reqs(struct rtrsx_clt_path *clt_path)
{
	struct rtrsx_clt_io_req *req;
	unsigned int i;
	int err = -ENOMEM;

	clt_path->reqs = kcalloc(clt_path->queue_depth,
				 sizeof(*clt_path->reqs), GFP_KERNEL);
	if (!clt_path->reqs)
		return -ENOMEM;

	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		req->iu = kzalloc(clt_path->max_hdr_size, GFP_KERNEL);
		if (!req->iu)
			goto out;

		req->sge = kcalloc(2, sizeof(*req->sge), GFP_KERNEL);
		if (!req->sge)
			goto out;

		/* BUG: rdma-local-mr-management -- the ULP allocates its own fast-registration MRs */
		req->mr = ib_alloc_mr(clt_path->dev->ib_pd, IB_MR_TYPE_MEM_REG,
				      clt_path->max_pages_per_mr); /* OK: rdma-registration-in-datapath -- allocated once per slot when the path is set up */
		if (IS_ERR(req->mr)) {
			err = PTR_ERR(req->mr);
			req->mr = NULL;
			pr_err("Failed to alloc clt_path->max_pages_per_mr %d\n",
			       clt_path->max_pages_per_mr);
			goto out;
		}

		init_completion(&req->inv_comp);
	}
	return 0;

out:
	/* OK: rdma-mr-leak -- free_path_reqs() deregisters the MR of every slot that holds one, including the slots before the failing one */
	rtrsx_free_path_reqs(clt_path);
	return err;
}

/**
 * rtrsx_clt_resize_req_mrs - adapt the request MRs to a new max_io_size
 * @clt_path: the reconnected path, no request in flight
 * @max_pages: pages per MR the new session allows
 */
int rtrsx_clt_resize_req_mrs(struct rtrsx_clt_path *clt_path,
			     unsigned int max_pages)
{
	struct rtrsx_clt_io_req *req;
	struct ib_mr *mr;
	unsigned int i;

	if (max_pages == clt_path->max_pages_per_mr)
		return 0;

	for (i = 0; i < clt_path->queue_depth; ++i) {
		req = &clt_path->reqs[i];
		/* BUG: rdma-local-mr-management -- the ULP allocates its own fast-registration MRs */
		mr = ib_alloc_mr(clt_path->dev->ib_pd, IB_MR_TYPE_MEM_REG,
				 max_pages);
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		/* BUG: rdma-mr-leak -- the slot's previous MR is overwritten without ib_dereg_mr() */
		req->mr = mr;
	}
	clt_path->max_pages_per_mr = max_pages;
	return 0;
}

static int rtrsx_map_sg_fr(struct rtrsx_clt_io_req *req, size_t count)
{
	int nr;

	/* Align the MR to a 4K page size to match the block virt boundary */
	/* BUG: rdma-local-mr-management -- the ULP maps the pages into its MR itself */
	nr = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
	if (nr < 0)
		return nr;
	if (unlikely(nr < req->sg_cnt))
		return -EINVAL;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	return nr;
}

/**
 * rtrsx_clt_build_reg - fast-register a READ request's pages
 * @req: the request
 * @count: DMA-mapped entries of req->sglist
 * @rwr: the registration work request to fill
 * @desc: the descriptor sent to the server
 */
int rtrsx_clt_build_reg(struct rtrsx_clt_io_req *req, size_t count,
			struct ib_reg_wr *rwr, struct rtrsx_sg_desc *desc)
{
	int ret;

	ret = rtrsx_map_sg_fr(req, count);
	if (ret < 0)
		return ret;

	memset(rwr, 0, sizeof(*rwr));
	rwr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	rwr->wr.num_sge = 0;
	rwr->mr = req->mr; /* OK: rdma-rkey-reuse -- rtrsx_map_sg_fr() advanced the key with ib_inc_rkey() */
	rwr->key = req->mr->rkey;
	rwr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	desc->addr = cpu_to_le64(req->mr->iova);
	desc->key = cpu_to_le32(req->mr->rkey);
	desc->len = cpu_to_le32(req->mr->length);
	req->need_inv = true;
	return 0;
}
