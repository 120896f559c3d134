// SPDX-License-Identifier: GPL-2.0
/*
 * pmemx_server.c - PMEMX remote memory server, RDMA side.
 *
 * The server owns one large region of pages that clients access with RDMA
 * READ and WRITE.  The region is fast-registered once and its key handed
 * to clients in the CONNECT reply; an administrator may revoke the key
 * (LOCAL_INV) and grant it again later.  Clients may also ask for a window
 * onto a sub-range (MAP_RANGE), which the server registers with an MR of
 * its own and destroys on UNMAP_RANGE.  Requests are executed from a work
 * item; replies are small inline SENDs, signaled every PMEMX_SIG_INTERVAL.
 * The server log buffer is registered for the records sent to monitors.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define PMEMX_RECV_DEPTH	2048
#define PMEMX_MAX_SEND_SGE	8
#define PMEMX_INLINE		256
#define PMEMX_SIG_INTERVAL	32
#define PMEMX_LOG_PAGES		16

struct pmemx_region {
	struct ib_mr		*mr;
	struct sg_table		sgt;
	struct page		**pages;
	int			npages, nents;
	u64			size;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct completion	done;
	struct mutex		lock;
};

struct pmemx_srv {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct pmemx_region	*region;
	struct ib_mr		*log_mr;
	struct scatterlist	log_sg[PMEMX_LOG_PAGES];
	struct ib_reg_wr	log_reg_wr;
	bool			log_registered;
};

struct pmemx_range {
	struct list_head	list;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		cqe;
	struct completion	done;
	int			status;
};

struct pmemx_conn {
	struct pmemx_srv	*srv;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			max_reqs;
	unsigned int		unsignaled;
	struct list_head	ranges;
};

struct pmemx_reply {
	__le32	tag;
	__le32	status;
	__le32	rkey;
	__le64	addr;
};

int pmemx_srv_init(struct pmemx_srv *srv)
{
	/* OK: rdma-remote-access-overbroad -- no global rkey: every exposure goes through a fast-registered MR */
	srv->pd = ib_alloc_pd(srv->dev, 0);
	if (IS_ERR(srv->pd))
		return PTR_ERR(srv->pd);
	/* BUG: rdma-local-mr-management -- the server allocates its own MR for the log */
	srv->log_mr = ib_alloc_mr(srv->pd, IB_MR_TYPE_MEM_REG, PMEMX_LOG_PAGES);
	if (IS_ERR(srv->log_mr)) {
		ib_dealloc_pd(srv->pd);
		return PTR_ERR(srv->log_mr);
	}
	return 0;
}

static int pmemx_create_qp(struct pmemx_conn *conn)
{
	struct ib_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	/* BUG: rdma-send-queue-manual-factor -- REG_MR and reply per request, counted by hand */
	attr.cap.max_send_wr = 2 * conn->max_reqs + 1; /* OK: rdma-send-queue-undersized -- a MAP_RANGE posts one REG_MR and one reply; one more for the drain */
	attr.cap.max_recv_wr = PMEMX_RECV_DEPTH; /* OK: rdma-queue-cap-unchecked -- pmemx_accept() compared the depth with attrs.max_qp_wr */
	/* BUG(file): rdma-queue-cap-unchecked -- eight SGEs requested without reading attrs.max_send_sge */
	attr.cap.max_send_sge = PMEMX_MAX_SEND_SGE;
	attr.cap.max_recv_sge = 1;
	/* BUG(file): rdma-queue-cap-unchecked -- 256 bytes of inline data, never checked against what the QP granted */
	attr.cap.max_inline_data = PMEMX_INLINE;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = attr.recv_cq = conn->cq;
	return rdma_create_qp(conn->cm_id, conn->srv->pd, &attr);
}

int pmemx_accept(struct pmemx_conn *conn)
{
	struct ib_device *dev = conn->srv->dev;
	int ret;

	if (dev->attrs.max_qp_wr < PMEMX_RECV_DEPTH)
		return -EINVAL;
	INIT_LIST_HEAD(&conn->ranges);
	ret = pmemx_create_qp(conn);
	if (!ret)
		conn->qp = conn->cm_id->qp;
	return ret;
}

static void pmemx_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct pmemx_range *range = container_of(wc->wr_cqe, struct pmemx_range, cqe);

	range->status = wc->status;
	complete(&range->done);
}

static int pmemx_send_reply(struct pmemx_conn *conn, struct pmemx_reply *rsp)
{
	struct ib_sge sge = { .addr = (uintptr_t)rsp, .length = sizeof(*rsp) };
	struct ib_send_wr wr = {
		.opcode = IB_WR_SEND, .sg_list = &sge, .num_sge = 1,
		.send_flags = IB_SEND_INLINE,
	};

	if (++conn->unsignaled == PMEMX_SIG_INTERVAL) {
		/* OK: rdma-unsignaled-send-starvation -- the counter goes up on every reply and is reset when one is signaled */
		wr.send_flags |= IB_SEND_SIGNALED;
		conn->unsignaled = 0;
	}
	return ib_post_send(conn->qp, &wr, NULL);
}

int pmemx_handle_map_range(struct pmemx_conn *conn, u16 tag, u64 off, u64 len)
{
	struct pmemx_region *region = conn->srv->region;
	struct pmemx_reply rsp = { .tag = cpu_to_le32(tag) };
	struct pmemx_range *range;
	int first, npages, n, ret;

	if (off + len > region->size || !len)
		return -ERANGE;
	first = off >> PAGE_SHIFT;
	npages = DIV_ROUND_UP(len + (off & ~PAGE_MASK), PAGE_SIZE);
	range = kzalloc(sizeof(*range), GFP_KERNEL);
	if (!range)
		return -ENOMEM;
	init_completion(&range->done);

	/* BUG: rdma-local-mr-management, rdma-registration-in-datapath -- an MR allocated for every MAP_RANGE request */
	range->mr = ib_alloc_mr(conn->srv->pd, IB_MR_TYPE_MEM_REG, npages);
	if (IS_ERR(range->mr)) {
		kfree(range);
		return -ENOMEM;
	}
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(range->mr, &region->sgt.sgl[first], npages, NULL, PAGE_SIZE);
	if (n != npages) {
		ret = -EINVAL;
		goto out_dereg;
	}

	range->cqe.done = pmemx_reg_done;
	range->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	range->reg_wr.wr.wr_cqe = &range->cqe;
	range->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	range->reg_wr.mr = range->mr; /* OK: rdma-rkey-reuse -- a new MR for every range, registered once and destroyed on UNMAP_RANGE */
	range->reg_wr.key = range->mr->rkey;
	/* OK: rdma-access-flags-invalid -- the window clients write through has local write too */
	range->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			       IB_ACCESS_REMOTE_WRITE;
	ret = ib_post_send(conn->qp, &range->reg_wr.wr, NULL);
	if (ret)
		goto out_dereg;
	wait_for_completion(&range->done);
	if (range->status != IB_WC_SUCCESS) {
		ret = -EIO;
		goto out_dereg;
	}

	rsp.rkey = cpu_to_le32(range->mr->rkey);
	rsp.addr = cpu_to_le64(range->mr->iova);
	ret = pmemx_send_reply(conn, &rsp);
	if (ret) {
		kfree(range); // BUG: rdma-mr-leak, rdma-invalidation-leak -- the range is freed with its MR still allocated and its key registered for remote write
		return ret;
	}
	list_add_tail(&range->list, &conn->ranges);
	return 0;

out_dereg:
	/* BUG: rdma-local-mr-management, rdma-registration-in-datapath -- deregistration of the per-request MR */
	ib_dereg_mr(range->mr); /* OK: rdma-mr-leak -- every failure before the reply releases the MR */
	kfree(range);
	return ret;
}

int pmemx_handle_unmap_range(struct pmemx_conn *conn, u16 tag, u32 rkey)
{
	struct pmemx_reply rsp = { .tag = cpu_to_le32(tag) };
	struct pmemx_range *range;

	list_for_each_entry(range, &conn->ranges, list)
		if (range->mr->rkey == rkey)
			goto found;
	rsp.status = cpu_to_le32(ENOENT);
	return pmemx_send_reply(conn, &rsp);

found:
	list_del(&range->list);
	/* BUG: rdma-local-mr-management, rdma-registration-in-datapath -- an MR destroyed for every UNMAP_RANGE request */
	ib_dereg_mr(range->mr); /* OK: rdma-invalidation-leak -- deregistration kills the range's key */
	kfree(range);
	return pmemx_send_reply(conn, &rsp);
}

/* The region's pages were allocated and put in region->sgt by the caller. */
int pmemx_region_setup(struct pmemx_srv *srv, struct pmemx_region *region)
{
	int n;

	region->nents = ib_dma_map_sg(srv->dev, region->sgt.sgl, region->npages,
				      DMA_BIDIRECTIONAL);
	if (!region->nents)
		return -EIO;
	/* BUG: rdma-local-mr-management -- the region MR is allocated by the ULP */
	region->mr = ib_alloc_mr(srv->pd, IB_MR_TYPE_MEM_REG, region->npages);
	if (IS_ERR(region->mr))
		goto out_unmap;
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(region->mr, region->sgt.sgl, region->nents, NULL, PAGE_SIZE);
	if (n != region->nents) {
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(region->mr); /* OK: rdma-mr-leak -- released before the error return */
		goto out_unmap;
	}
	mutex_init(&region->lock);
	init_completion(&region->done);
	srv->region = region;
	return 0;

out_unmap:
	ib_dma_unmap_sg(srv->dev, region->sgt.sgl, region->npages, DMA_BIDIRECTIONAL);
	return -EIO;
}

static void pmemx_region_done(struct ib_cq *cq, struct ib_wc *wc)
{
	complete(&container_of(wc->wr_cqe, struct pmemx_region, cqe)->done);
}

int pmemx_region_grant(struct pmemx_conn *conn, struct pmemx_reply *rsp)
{
	struct pmemx_region *region = conn->srv->region;
	int ret;

	mutex_lock(&region->lock);
	region->cqe.done = pmemx_region_done;
	memset(&region->reg_wr, 0, sizeof(region->reg_wr));
	region->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	region->reg_wr.wr.wr_cqe = &region->cqe;
	region->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	region->reg_wr.mr = region->mr; // BUG: rdma-rkey-reuse -- a grant after a revoke registers the region under the key the revoked clients still hold
	region->reg_wr.key = region->mr->rkey;
	/* BUG: rdma-access-flags-invalid -- clients write into the region, but the registration lacks IB_ACCESS_LOCAL_WRITE */
	region->reg_wr.access = IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;
	reinit_completion(&region->done);
	ret = ib_post_send(conn->qp, &region->reg_wr.wr, NULL);
	if (!ret)
		wait_for_completion(&region->done);
	mutex_unlock(&region->lock);
	rsp->rkey = cpu_to_le32(region->mr->rkey); /* OK: rdma-remote-access-overbroad -- the region key is what clients connect for */
	return ret;
}

int pmemx_region_revoke(struct pmemx_conn *conn)
{
	struct pmemx_region *region = conn->srv->region;
	int ret;

	mutex_lock(&region->lock);
	region->inv_wr.opcode = IB_WR_LOCAL_INV;
	region->inv_wr.wr_cqe = &region->cqe;
	region->inv_wr.send_flags = IB_SEND_SIGNALED;
	region->inv_wr.ex.invalidate_rkey = region->mr->rkey;
	reinit_completion(&region->done);
	ret = ib_post_send(conn->qp, &region->inv_wr, NULL);
	if (!ret)
		wait_for_completion(&region->done);
	mutex_unlock(&region->lock);
	return ret;
}

static void pmemx_free_region_pages(struct pmemx_srv *srv, struct pmemx_region *region)
{
	int i;

	ib_dma_unmap_sg(srv->dev, region->sgt.sgl, region->nents, DMA_BIDIRECTIONAL);
	for (i = 0; i < region->npages; i++)
		__free_page(region->pages[i]);
	sg_free_table(&region->sgt);
}

void pmemx_region_destroy(struct pmemx_srv *srv)
{
	struct pmemx_region *region = srv->region;

	/* BUG: rdma-invalidation-leak -- the pages go back to the allocator while the region key still grants remote write; deregister first */
	pmemx_free_region_pages(srv, region);
	/* BUG: rdma-local-mr-management -- deregistration by the ULP */
	ib_dereg_mr(region->mr);
	kfree(region->pages);
	kfree(region);
}

int pmemx_log_register(struct pmemx_conn *conn)
{
	struct pmemx_srv *srv = conn->srv;
	struct ib_reg_wr *reg = &srv->log_reg_wr;
	int n;

	if (srv->log_registered)
		return 0;
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(srv->log_mr, srv->log_sg, PMEMX_LOG_PAGES, NULL, PAGE_SIZE);
	if (n != PMEMX_LOG_PAGES)
		return -EINVAL;

	reg->wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	reg->wr.send_flags = 0;
	reg->mr = srv->log_mr; /* OK: rdma-rkey-reuse -- the log MR is registered once for the server's lifetime */
	reg->key = srv->log_mr->rkey;
	/* BUG: rdma-remote-access-overbroad -- the log's rkey is never sent anywhere; records go out by SEND with its lkey */
	reg->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	srv->log_registered = true;
	return ib_post_send(conn->qp, &reg->wr, NULL);
}

void pmemx_srv_exit(struct pmemx_srv *srv)
{
	pmemx_region_destroy(srv);
	/* BUG: rdma-local-mr-management -- deregistration by the ULP */
	ib_dereg_mr(srv->log_mr);
	ib_dealloc_pd(srv->pd);
}
