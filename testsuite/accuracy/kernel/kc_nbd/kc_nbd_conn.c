// SPDX-License-Identifier: GPL-2.0
/*
 * kc_nbd_conn.c - queue setup and teardown.  Known problems: hand-made SQ
 * factor; no receive entry for the drain; inline size never read back; the
 * small-read option takes the PD's global rkey; the request-table unwinding
 * misses one MR and a late setup failure leaks all of them.
 */
#include "kc_nbd.h"

static struct ib_mr *kc_nbd_alloc_mr(struct kc_nbd_queue *q)
{
	struct ib_mr *mr;

	mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, KC_NBD_MAX_PAGES); /* OK: rdma-registration-in-datapath -- only for the request table at queue setup */
	return IS_ERR(mr) ? NULL : mr;
}

static void kc_nbd_free_mr(struct ib_mr *mr)
{
	ib_dereg_mr(mr);
}

static int kc_nbd_alloc_reqs(struct kc_nbd_queue *q)
{
	struct kc_nbd_req *req;
	int i;

	INIT_LIST_HEAD(&q->free_list);
	for (i = 0; i < q->depth; i++) {
		req = &q->reqs[i];
		req->q = q;
		req->tag = i;
		req->mr = kc_nbd_alloc_mr(q);
		if (!req->mr)
			goto out_unwind;
		req->cmd = kzalloc(sizeof(*req->cmd), GFP_KERNEL);
		if (!req->cmd)
			goto out_unwind; /* BUG: rdma-mr-leak -- reqs[i].mr was just allocated, the unwinding below only covers the entries before i */
		req->cmd_dma = ib_dma_map_single(q->ibdev, req->cmd,
						 sizeof(*req->cmd), DMA_TO_DEVICE);
		list_add_tail(&req->list, &q->free_list);
	}
	return 0;

out_unwind:
	while (i--) {
		kc_nbd_free_mr(q->reqs[i].mr);
		kfree(q->reqs[i].cmd);
	}
	return -ENOMEM;
}

int kc_nbd_post_recv(struct kc_nbd_queue *q, struct kc_nbd_rx *rx)
{
	struct ib_sge sge = { rx->dma, sizeof(*rx->rsp), q->pd->local_dma_lkey };
	struct ib_recv_wr wr = { .wr_cqe = &rx->cqe, .sg_list = &sge, .num_sge = 1 };

	rx->cqe.done = kc_nbd_recv_done;
	return ib_post_recv(q->qp, &wr, NULL);
}

int kc_nbd_create_queue(struct kc_nbd_queue *q)
{
	struct ib_qp_init_attr attr = {};
	unsigned int pd_flags = 0;
	int i, ret;

	if (q->fast_small_reads)	/* one-page reads skip registration */
		pd_flags |= IB_PD_UNSAFE_GLOBAL_RKEY;
	q->pd = ib_alloc_pd(q->ibdev, pd_flags); /* BUG: rdma-remote-access-overbroad -- the global rkey opens all of memory to the target for the sake of small reads */
	if (IS_ERR(q->pd))
		return PTR_ERR(q->pd);

	attr.send_cq = attr.recv_cq = q->cq;
	/* BUG(program): rdma-send-queue-manual-factor -- depth times a hand-kept count of REG_MR/SEND/LOCAL_INV instead of max_rdma_ctxs */
	attr.cap.max_send_wr = KC_NBD_WRS_PER_REQ * q->depth + 1; /* OK: rdma-send-queue-undersized -- REG_MR, SEND and LOCAL_INV per request plus one for the drain */
	/* BUG(program): rdma-send-queue-undersized -- every entry holds a posted receive (refilled in kc_nbd_recv_done()), the receive ib_drain_qp() posts finds no room */
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = KC_NBD_INLINE_SIZE; /* BUG(file): rdma-queue-cap-unchecked -- 256 bytes of inline data, the granted value is never read back */
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	ret = rdma_create_qp(q->cm_id, q->pd, &attr);
	if (ret)
		goto out_dealloc_pd;
	q->qp = q->cm_id->qp;
	q->max_inline = KC_NBD_INLINE_SIZE;

	ret = kc_nbd_alloc_reqs(q);
	if (ret)
		goto out_destroy_qp;
	for (i = 0; i < q->depth; i++) {
		ret = kc_nbd_post_recv(q, &q->rx[i]);
		if (ret)
			goto out_destroy_qp; /* BUG: rdma-mr-leak -- nothing on this path deregisters the request MRs kc_nbd_alloc_reqs() just made */
	}
	return 0;

out_destroy_qp:
	rdma_destroy_qp(q->cm_id);
out_dealloc_pd:
	ib_dealloc_pd(q->pd);
	return ret;
}

void kc_nbd_destroy_queue(struct kc_nbd_queue *q)
{
	int i;

	ib_drain_qp(q->qp);
	for (i = 0; i < q->depth; i++) {
		kc_nbd_free_mr(q->reqs[i].mr);
		ib_dma_unmap_single(q->ibdev, q->reqs[i].cmd_dma,
				    sizeof(*q->reqs[i].cmd), DMA_TO_DEVICE);
		kfree(q->reqs[i].cmd);
	}
	rdma_destroy_qp(q->cm_id);
	ib_dealloc_pd(q->pd);
}
