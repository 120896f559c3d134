// SPDX-License-Identifier: GPL-2.0
/*
 * fma: the in-kernel agent of an invented fabric manager ("fma"). The
 * manager pushes configuration by telling the agent where to RDMA READ a
 * blob from, and reads the agent's status page through an MR the agent
 * registers once and advertises; the manager may invalidate that key with
 * SEND_WITH_INV when it is done with a status sweep.
 *
 * Bugs: every configuration request keeps an RDMA READ and the
 * acknowledgement SEND on the send queue, but only one entry per request is
 * reserved; the READ lands in local_dma_lkey memory, which fails on iWARP
 * (the agent does not refuse iWARP devices); the agent treats any remote
 * invalidation as the end of the status MR's key without comparing it; and
 * teardown deregisters the status MR right after posting an unsignaled
 * LOCAL_INV for it, while that work request may still be queued.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct fma_agent {
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			depth;
	struct ib_mr		*status_mr;
	struct scatterlist	status_sg;
	bool			status_exposed;
	__be32			status_rkey;
};

struct fma_req {
	struct fma_agent	*agent;
	struct ib_rdma_wr	read_wr;
	struct ib_send_wr	ack_wr;
	struct ib_sge		blob_sge;
	struct ib_sge		ack_sge;
	struct ib_cqe		cqe;
	u64			blob_dma;
	u32			blob_len;
	u64			ack_dma;
};

int fma_create_qp(struct fma_agent *a)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = a;
	attr.send_cq = a->cq;
	attr.recv_cq = a->cq;
	attr.qp_type = IB_QPT_RC;
	/* BUG: rdma-send-queue-undersized -- a configuration request keeps a READ and an ACK SEND outstanding; one entry per request is reserved */
	attr.cap.max_send_wr = a->depth + 1;
	attr.cap.max_recv_wr = a->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	a->qp = ib_create_qp(a->pd, &attr);
	if (IS_ERR(a->qp))
		return PTR_ERR(a->qp);
	return 0;
}

int fma_expose_status(struct fma_agent *a)
{
	struct ib_reg_wr wr = { };

	/* BUG: rdma-local-mr-management -- the agent allocates its own MR */
	a->status_mr = ib_alloc_mr(a->pd, IB_MR_TYPE_MEM_REG, 1); /* OK: rdma-registration-in-datapath -- the status page is exposed once when the agent starts */
	if (IS_ERR(a->status_mr))
		return PTR_ERR(a->status_mr);
	/* BUG: rdma-local-mr-management -- the agent maps the status page into its MR */
	if (ib_map_mr_sg(a->status_mr, &a->status_sg, 1, NULL, SZ_4K) != 1)
		goto out_dereg;
	ib_update_fast_reg_key(a->status_mr, ib_inc_rkey(a->status_mr->rkey));
	wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the agent */
	wr.mr = a->status_mr;
	wr.key = a->status_mr->rkey;
	wr.access = IB_ACCESS_REMOTE_READ;
	if (ib_post_send(a->qp, &wr.wr, NULL))
		goto out_dereg;
	a->status_rkey = cpu_to_be32(a->status_mr->rkey);
	a->status_exposed = true;
	return 0;

out_dereg:
	/* BUG: rdma-local-mr-management -- the agent deregisters its MR */
	ib_dereg_mr(a->status_mr);
	a->status_mr = NULL;
	return -EIO;
}

void fma_recv_done(struct fma_agent *a, struct ib_wc *wc)
{
	/* BUG: rdma-remote-invalidate-unchecked -- any invalidated rkey ends the status page's exposure; wc->ex.invalidate_rkey is never compared */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
		a->status_exposed = false;
}

int fma_apply_config(struct fma_req *r, u64 raddr, u32 rkey)
{
	struct fma_agent *a = r->agent;

	r->blob_sge.addr = r->blob_dma;
	r->blob_sge.length = r->blob_len;
	r->blob_sge.lkey = a->pd->local_dma_lkey;
	r->read_wr.wr.opcode = IB_WR_RDMA_READ;
	r->read_wr.wr.sg_list = &r->blob_sge;
	r->read_wr.wr.num_sge = 1;
	r->read_wr.wr.send_flags = 0;
	r->read_wr.remote_addr = raddr;
	r->read_wr.rkey = rkey;
	r->read_wr.wr.next = &r->ack_wr;

	r->ack_sge.addr = r->ack_dma;
	r->ack_sge.length = 8;
	r->ack_sge.lkey = a->pd->local_dma_lkey;
	r->ack_wr.next = NULL;
	r->ack_wr.wr_cqe = &r->cqe;
	r->ack_wr.opcode = IB_WR_SEND;
	r->ack_wr.sg_list = &r->ack_sge;
	r->ack_wr.num_sge = 1;
	r->ack_wr.send_flags = IB_SEND_SIGNALED;
	/* BUG: rdma-access-flags-transport -- the configuration READ lands in local_dma_lkey memory; on iWARP it needs a REMOTE_WRITE registration */
	return ib_post_send(a->qp, &r->read_wr.wr, NULL);
}

void fma_destroy(struct fma_agent *a)
{
	struct ib_send_wr inv = {
		.opcode = IB_WR_LOCAL_INV,
		.send_flags = 0,
	};

	if (a->status_exposed) {
		inv.ex.invalidate_rkey = a->status_mr->rkey;
		ib_post_send(a->qp, &inv, NULL);
	}
	/* BUG: rdma-local-mr-management -- the agent deregisters its MR */
	ib_dereg_mr(a->status_mr); /* BUG: rdma-unmap-before-invalidate -- deregistered while the unsignaled LOCAL_INV that references it may still be queued */
	ib_destroy_qp(a->qp);
}
