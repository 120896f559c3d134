// SPDX-License-Identifier: GPL-2.0
/*
 * tel: the telemetry uplink of an invented cluster monitor ("tel"). Each
 * connection pushes sample batches to a collector with RDMA WRITEs from a
 * bounce buffer that is fast-registered for local access only.
 *
 * The uplink MR is meant to be a cache: allocated on first use in the submit
 * path and kept ("if (!conn->mr) conn->mr = ib_alloc_mr(...)"). The event
 * channel does that right. The sample channel's completion handler, however,
 * deregisters the MR after every batch "to release the pages", so the
 * allocation on the next batch is not a cache hit but a per-I/O
 * allocation, and the completion path pays a deregistration each time.
 * The MRs are local-only (LOCAL_WRITE, no remote rights), so no key is
 * exposed and no invalidation is needed before deregistration.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

#define TEL_BATCH_PAGES	8

struct tel_chan {
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_mr		*mr;
	struct scatterlist	sg[TEL_BATCH_PAGES];
	int			nents;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	write_wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	u64			remote_addr;
	u32			remote_rkey;
};

static int tel_reg_bounce(struct tel_chan *ch)
{
	/* BUG: rdma-local-mr-management -- the uplink maps its bounce buffer into its own MR */
	if (ib_map_mr_sg(ch->mr, ch->sg, ch->nents, NULL, SZ_4K) != ch->nents)
		return -EINVAL;
	ib_update_fast_reg_key(ch->mr, ib_inc_rkey(ch->mr->rkey));
	memset(&ch->reg_wr, 0, sizeof(ch->reg_wr));
	ch->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the uplink */
	ch->reg_wr.wr.next = &ch->write_wr.wr;
	ch->reg_wr.mr = ch->mr;
	ch->reg_wr.key = ch->mr->rkey;
	ch->reg_wr.access = IB_ACCESS_LOCAL_WRITE; /* OK: rdma-remote-access-overbroad -- local access only: the MR is the WRITE source */
	return 0;
}

static int tel_post_batch(struct tel_chan *ch, u32 len)
{
	int ret = tel_reg_bounce(ch);

	if (ret)
		return ret;
	ch->sge.addr = ch->mr->iova;
	ch->sge.length = len;
	ch->sge.lkey = ch->mr->lkey;
	ch->write_wr.wr.next = NULL;
	ch->write_wr.wr.wr_cqe = &ch->cqe;
	ch->write_wr.wr.opcode = IB_WR_RDMA_WRITE;
	ch->write_wr.wr.sg_list = &ch->sge;
	ch->write_wr.wr.num_sge = 1;
	ch->write_wr.wr.send_flags = IB_SEND_SIGNALED;
	ch->write_wr.remote_addr = ch->remote_addr;
	ch->write_wr.rkey = ch->remote_rkey;
	return ib_post_send(ch->qp, &ch->reg_wr.wr, NULL);
}

static void tel_events_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_warn("tel: event batch failed: %s\n",
			ib_wc_status_msg(wc->status));
}

void tel_samples_done(struct ib_cq *cq, struct ib_wc *wc);

int tel_send_events(struct tel_chan *ch, u32 len)
{
	ch->cqe.done = tel_events_done;
	if (!ch->mr) {
		/* BUG: rdma-local-mr-management -- the uplink allocates its own MR */
		ch->mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, TEL_BATCH_PAGES); /* OK: rdma-registration-in-datapath -- allocated on first use and kept for the channel's lifetime */
		if (IS_ERR(ch->mr)) {
			int ret = PTR_ERR(ch->mr);

			ch->mr = NULL;
			return ret;
		}
	}
	return tel_post_batch(ch, len);
}

int tel_send_samples(struct tel_chan *ch, u32 len)
{
	ch->cqe.done = tel_samples_done;
	if (!ch->mr) {
		/* BUG: rdma-local-mr-management -- the uplink allocates its own MR */
		ch->mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, TEL_BATCH_PAGES); /* BUG: rdma-registration-in-datapath -- tel_samples_done() drops the MR after every batch, so this runs once per batch */
		if (IS_ERR(ch->mr)) {
			int ret = PTR_ERR(ch->mr);

			ch->mr = NULL;
			return ret;
		}
	}
	return tel_post_batch(ch, len);
}

void tel_samples_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct tel_chan *ch = container_of(wc->wr_cqe, struct tel_chan, cqe);

	/* release the pages until the next batch */
	/* BUG: rdma-local-mr-management -- the uplink deregisters its MR */
	ib_dereg_mr(ch->mr); /* BUG: rdma-registration-in-datapath -- deregistration in the completion handler of every batch */
	ch->mr = NULL;
}

void tel_chan_close(struct tel_chan *ch)
{
	if (ch->mr) {
		/* BUG: rdma-local-mr-management -- the uplink deregisters its MR */
		ib_dereg_mr(ch->mr); /* OK: rdma-registration-in-datapath -- channel teardown */
		ch->mr = NULL;
	}
}
