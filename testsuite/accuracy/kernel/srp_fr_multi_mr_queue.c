// SPDX-License-Identifier: GPL-2.0
/*
 * srpx: fast-registration I/O path of a SCSI RDMA Protocol initiator, in
 * the shape of drivers/infiniband/ulp/srp/ib_srp.c (srp_create_ch_ib,
 * srp_map_finish_fr, srp_map_sg_fr, srp_inv_rkey, srp_unmap_data) with the
 * driver's own descriptor pool replaced by ib_mr_pool, as nvme-rdma does.
 * Written fresh for the held-out batch.
 *
 * A command may need up to SRPX_MR_PER_CMD memory registrations. Each one
 * is a REG_MR work request; when the response arrives srpx_unmap_data()
 * posts one unsignaled LOCAL_INV per registration and returns the MRs to
 * the pool and unmaps the pages right away (the upstream shape).
 *
 * Defects:
 *  - the send queue is sized with the factor of ib_srp.c before mr_per_cmd
 *    was introduced ("m = use_fast_reg ? 3 : 1", i.e. SEND + REG + INV),
 *    but a command can post 1 SEND + 2 REG_MR + 2 LOCAL_INV;
 *  - srpx_unmap_data() releases MRs right after unsignaled LOCAL_INVs, also
 *    when queueing a LOCAL_INV failed;
 *  - the "Out of MRs" test sits after the pool get (a regression written
 *    for this batch; upstream tests before taking a descriptor) and drops
 *    the MR it just took.
 * Correct: the key is rotated before every registration, a failed
 * ib_map_mr_sg() returns the MR, and the command SEND is signaled.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define SRPX_MR_PER_CMD		2
#define SRPX_MAX_PAGES_PER_MR	256

struct srpx_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct srpx_target {
	int			queue_size;
	bool			use_fast_reg;
	unsigned int		mr_page_size;
	struct work_struct	tl_err_work;
};

struct srpx_rdma_ch {
	struct srpx_target	*target;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct ib_qp		*qp;
};

struct srpx_iu {
	u64			dma;
	u32			size;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
};

struct srpx_request {
	struct ib_mr		*mr_list[SRPX_MR_PER_CMD];
	short			nmdesc;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*sg;
	int			sg_count;
	enum dma_data_direction	dir;
};

struct srpx_map_state {
	struct ib_mr		**next;
	struct ib_mr		**end;
	struct srpx_direct_buf	*desc;
	unsigned int		ndesc;
	unsigned int		total_len;
};

static void srpx_handle_qp_err(struct ib_cq *cq, struct ib_wc *wc,
			       const char *opname)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("failed %s status %s (%d)\n", opname,
		       ib_wc_status_msg(wc->status), wc->status);
}

/**
 * srpx_create_ch_ib - create the channel's queue pair and MR pool
 * @ch: the RDMA channel
 */
int srpx_create_ch_ib(struct srpx_rdma_ch *ch)
{
	struct srpx_target *target = ch->target;
	struct ib_qp_init_attr *init_attr;
	const int m = target->use_fast_reg ? 3 : 1;
	int ret;

	init_attr = kzalloc(sizeof(*init_attr), GFP_KERNEL);
	if (!init_attr)
		return -ENOMEM;

	init_attr->event_handler = NULL;
	/* BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- the hand-made factor 3 (SEND, REG, INV) covers one MR, but a command posts a REG_MR and a LOCAL_INV for each of up to SRPX_MR_PER_CMD MRs, and ib_drain_qp() gets no entry */
	init_attr->cap.max_send_wr = m * target->queue_size;
	init_attr->cap.max_recv_wr = target->queue_size + 1;
	init_attr->cap.max_recv_sge = 1;
	init_attr->cap.max_send_sge = 1;
	init_attr->sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every command SEND is signaled and retires the REG_MR and LOCAL_INV entries before it */
	init_attr->qp_type = IB_QPT_RC;
	init_attr->send_cq = ch->send_cq;
	init_attr->recv_cq = ch->recv_cq;

	ch->qp = ib_create_qp(ch->pd, init_attr);
	if (IS_ERR(ch->qp)) {
		ret = PTR_ERR(ch->qp);
		goto err;
	}

	if (target->use_fast_reg) {
		/* BUG: rdma-local-mr-management -- the ULP fills its own MR pool */
		ret = ib_mr_pool_init(ch->qp, &ch->qp->rdma_mrs,
				      target->queue_size * SRPX_MR_PER_CMD,
				      IB_MR_TYPE_MEM_REG,
				      SRPX_MAX_PAGES_PER_MR, 0);
		if (ret)
			goto err_qp;
	}
	kfree(init_attr);
	return 0;

err_qp:
	ib_destroy_qp(ch->qp);
err:
	kfree(init_attr);
	return ret;
}

void srpx_free_ch_ib(struct srpx_rdma_ch *ch)
{
	ib_drain_qp(ch->qp);
	if (ch->target->use_fast_reg)
		ib_mr_pool_destroy(ch->qp, &ch->qp->rdma_mrs);
	ib_destroy_qp(ch->qp);
}

static void srpx_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	srpx_handle_qp_err(cq, wc, "FAST REG");
}

static void srpx_inv_rkey_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	srpx_handle_qp_err(cq, wc, "INV RKEY");
}

static void srpx_map_desc(struct srpx_map_state *state, u64 dma_addr,
			  u32 dma_len, u32 rkey)
{
	struct srpx_direct_buf *desc = state->desc;

	desc->va = cpu_to_be64(dma_addr);
	desc->key = cpu_to_be32(rkey);
	desc->len = cpu_to_be32(dma_len);

	state->total_len += dma_len;
	state->desc++;
	state->ndesc++;
}

static int srpx_map_finish_fr(struct srpx_map_state *state,
			      struct srpx_request *req,
			      struct srpx_rdma_ch *ch, struct scatterlist *sg,
			      int sg_nents)
{
	struct srpx_target *target = ch->target;
	struct ib_reg_wr wr;
	struct ib_mr *mr;
	u32 rkey;
	int n, err;

	/* BUG: rdma-local-mr-management -- per-command MR taken from the ULP's own pool */
	mr = ib_mr_pool_get(ch->qp, &ch->qp->rdma_mrs);
	if (!mr)
		return -ENOMEM;

	if (state->next >= state->end) {
		pr_err("Out of MRs (mr_per_cmd = %d)\n", SRPX_MR_PER_CMD);
		/* BUG: rdma-mr-leak -- the MR taken from the pool just above is neither recorded in the request nor put back */
		return -ENOMEM;
	}

	rkey = ib_inc_rkey(mr->rkey);
	ib_update_fast_reg_key(mr, rkey);

	/* BUG: rdma-local-mr-management -- the ULP maps the pages into its MR itself */
	n = ib_map_mr_sg(mr, sg, sg_nents, NULL, target->mr_page_size);
	if (unlikely(n < 0)) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the ULP's pool */
		ib_mr_pool_put(ch->qp, &ch->qp->rdma_mrs, mr); /* OK: rdma-mr-leak -- a failed map returns the MR before anything was posted */
		pr_err("ib_map_mr_sg(%d) returned %d.\n", sg_nents, n);
		return n;
	}

	req->reg_cqe.done = srpx_reg_mr_err_done;

	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = mr; /* OK: rdma-rkey-reuse -- ib_inc_rkey() gave the MR a new key before the map */
	wr.key = mr->rkey;
	wr.access = (IB_ACCESS_LOCAL_WRITE |
		     IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE);

	*state->next++ = mr;
	req->nmdesc++;

	srpx_map_desc(state, mr->iova, mr->length, mr->rkey);

	err = ib_post_send(ch->qp, &wr.wr, NULL);
	if (unlikely(err)) {
		pr_err("REG_MR post failed (%d)\n", err);
		return err;
	}
	return n;
}

int srpx_map_sg_fr(struct srpx_map_state *state, struct srpx_rdma_ch *ch,
		   struct srpx_request *req, struct scatterlist *scat,
		   int count)
{
	int n;

	state->next = req->mr_list;
	state->end = req->mr_list + SRPX_MR_PER_CMD;

	while (count) {
		n = srpx_map_finish_fr(state, req, ch, scat, count);
		if (unlikely(n < 0))
			return n;
		count -= n;
		while (n--)
			scat = sg_next(scat);
	}
	return 0;
}

static int srpx_inv_rkey(struct srpx_request *req, struct srpx_rdma_ch *ch,
			 u32 rkey)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = 0,
		.ex.invalidate_rkey = rkey,
	};

	wr.wr_cqe = &req->inv_cqe;
	req->inv_cqe.done = srpx_inv_rkey_err_done;
	return ib_post_send(ch->qp, &wr, NULL);
}

/**
 * srpx_unmap_data - release the registrations of a completed command
 * @ch: the channel the command ran on
 * @req: the command
 */
void srpx_unmap_data(struct srpx_rdma_ch *ch, struct srpx_request *req)
{
	struct srpx_target *target = ch->target;
	int i, res;

	if (target->use_fast_reg) {
		for (i = 0; i < req->nmdesc; i++) {
			res = srpx_inv_rkey(req, ch, req->mr_list[i]->rkey);
			if (res < 0) {
				pr_err("Queueing INV WR for rkey %#x failed (%d)\n",
				       req->mr_list[i]->rkey, res);
				schedule_work(&target->tl_err_work);
			}
		}
		for (i = 0; i < req->nmdesc; i++)
			/* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak, rdma-local-mr-management -- the MRs go back to the ULP's pool right after unsignaled LOCAL_INVs, and also when queueing a LOCAL_INV failed and the key is still live */
			ib_mr_pool_put(ch->qp, &ch->qp->rdma_mrs,
				       req->mr_list[i]);
		req->nmdesc = 0;
	}

	ib_dma_unmap_sg(ch->dev, req->sg, req->sg_count, req->dir);
}

static void srpx_cmd_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		srpx_handle_qp_err(cq, wc, "SEND");
}

int srpx_post_send(struct srpx_rdma_ch *ch, struct srpx_iu *iu, int len)
{
	struct ib_send_wr wr;

	iu->sge.addr = iu->dma;
	iu->sge.length = len;
	iu->sge.lkey = ch->pd->local_dma_lkey;

	iu->cqe.done = srpx_cmd_done;

	wr.next = NULL;
	wr.wr_cqe = &iu->cqe;
	wr.sg_list = &iu->sge;
	wr.num_sge = 1;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(ch->qp, &wr, NULL);
}
