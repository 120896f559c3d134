// SPDX-License-Identifier: GPL-2.0
/*
 * rtc: the I/O path of an RTRS-client-style transport (modelled on
 * drivers/infiniband/ulp/rtrs/rtrs-clt.c, written fresh). For a READ the
 * client fast-registers its pages, chains the REG_MR in front of an
 * RDMA_WRITE_WITH_IMM that places the request descriptor in the server's
 * chunk, and the server RDMA-writes the data back and answers with
 * SEND_WITH_INV of the client's key; if the server could not invalidate,
 * the client posts a LOCAL_INV.
 *
 * The send queue is sized queue_depth * 3 + 1 for REG_MR, the descriptor
 * WRITE and the LOCAL_INV, with one to spare for the drain: enough, but by a
 * hand-made factor. The bug: the response handler takes IB_WC_WITH_INVALIDATE
 * as "my key is dead" without comparing wc->ex.invalidate_rkey with the
 * request's MR. Keys are rotated, flags are valid, and the key travels in
 * the request descriptor.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct rtc_path {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			queue_depth;
	u64			chunk_base;
	u32			chunk_rkey;
	u32			chunk_size;
};

struct rtc_desc {
	__be64	addr;
	__be32	key;
	__be32	len;
};

struct rtc_req {
	struct rtc_path		*path;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	imm_wr;
	struct ib_send_wr	inv_wr;
	struct ib_sge		sge;
	struct ib_cqe		inv_cqe;
	struct ib_cqe		imm_cqe;
	struct scatterlist	*sgl;
	int			sg_cnt;
	bool			need_inv;
	u32			msg_id;
	struct rtc_desc		*desc;
	u64			desc_dma;
};

void rtc_complete_req(struct rtc_req *req, int errno);

int rtc_create_qp(struct rtc_path *p)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = p;
	attr.send_cq = p->cq;
	attr.recv_cq = p->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- the descriptor WRITE and the LOCAL_INV are signaled */
	/* BUG: rdma-send-queue-manual-factor -- the depth times a hand-made "REG, WRITE, INV" factor */
	attr.cap.max_send_wr = p->queue_depth * 3 + 1; /* OK: rdma-send-queue-undersized -- REG_MR, WRITE_WITH_IMM and LOCAL_INV per request, plus one for the drain */
	attr.cap.max_recv_wr = p->queue_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	p->qp = ib_create_qp(p->pd, &attr);
	if (IS_ERR(p->qp))
		return PTR_ERR(p->qp);
	return 0;
}

void rtc_destroy_qp(struct rtc_path *p)
{
	ib_drain_qp(p->qp);
	ib_destroy_qp(p->qp);
}

int rtc_read_req(struct rtc_req *req)
{
	struct rtc_path *p = req->path;
	int n;

	/* BUG: rdma-local-mr-management -- per-request MR from the client's own pool */
	req->mr = ib_mr_pool_get(p->qp, &p->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the client maps pages into its MR */
	n = ib_map_mr_sg(req->mr, req->sgl, req->sg_cnt, NULL, SZ_4K);
	if (n != req->sg_cnt) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(p->qp, &p->qp->rdma_mrs, req->mr); /* OK: rdma-mr-leak -- returned on the short map */
		req->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	req->reg_wr.wr.next = &req->imm_wr.wr;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- rotated just above */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- LOCAL_WRITE accompanies REMOTE_WRITE */

	req->desc->addr = cpu_to_be64(req->mr->iova);
	req->desc->key = cpu_to_be32(req->mr->rkey);
	req->desc->len = cpu_to_be32(req->mr->length);

	req->sge.addr = req->desc_dma;
	req->sge.length = sizeof(*req->desc);
	req->sge.lkey = p->pd->local_dma_lkey;
	req->imm_wr.wr.next = NULL;
	req->imm_wr.wr.wr_cqe = &req->imm_cqe;
	req->imm_wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	req->imm_wr.wr.ex.imm_data = cpu_to_be32(req->msg_id);
	req->imm_wr.wr.sg_list = &req->sge;
	req->imm_wr.wr.num_sge = 1;
	req->imm_wr.wr.send_flags = IB_SEND_SIGNALED;
	req->imm_wr.remote_addr = p->chunk_base + req->msg_id * p->chunk_size;
	req->imm_wr.rkey = p->chunk_rkey;
	req->need_inv = true;

	return ib_post_send(p->qp, &req->reg_wr.wr, NULL);
}

static void rtc_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rtc_req *req = container_of(wc->wr_cqe, struct rtc_req, inv_cqe);

	req->need_inv = false;
	rtc_complete_req(req, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}

void rtc_process_rsp(struct rtc_req *req, struct ib_wc *wc, int errno)
{
	/* BUG: rdma-remote-invalidate-unchecked -- the server's SEND_WITH_INV is taken as invalidating this request's key without comparing wc->ex.invalidate_rkey */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
		req->need_inv = false;

	if (req->need_inv) {
		req->inv_wr.opcode = IB_WR_LOCAL_INV;
		req->inv_wr.next = NULL;
		req->inv_wr.num_sge = 0;
		req->inv_wr.send_flags = IB_SEND_SIGNALED;
		req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
		req->inv_cqe.done = rtc_inv_done;
		req->inv_wr.wr_cqe = &req->inv_cqe;
		if (!ib_post_send(req->path->qp, &req->inv_wr, NULL))
			return;
		errno = -EIO;	/* the path is closed on failure; MRs die with it */
	}
	rtc_complete_req(req, errno);
}
