// SPDX-License-Identifier: GPL-2.0
/*
 * rsx srv_path.c: QP creation and chunk registration (see rtrsx.h).
 *
 * The chunks clients RDMA-WRITE into are fast-registered once, when the path
 * is set up: the REG_MRs are posted (the last one signaled and waited for)
 * and the keys go to the client in the info response SEND, so this setup
 * code posts work requests without being an I/O path. The registrations
 * grant REMOTE_WRITE but leave out LOCAL_WRITE, so they complete in error on
 * every device. The receive queue is a fixed 4096 entries with no look at
 * max_qp_wr. The send queue is sized two data work requests per I/O
 * (the RDMA WRITE and the response), which covers what srv_io.c posts per
 * I/O; the REG_MRs here run before any I/O.
 */
#include "rtrsx.h"

int rsx_create_qp(struct rsx_path *p)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = p;
	attr.send_cq = p->cq;
	attr.recv_cq = p->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	/* OK: rdma-send-queue-manual-factor -- the factor 2 is the WRITE and the response of an I/O; no registration runs per I/O */
	attr.cap.max_send_wr = 2 * p->queue_depth + 1;
	attr.cap.max_recv_wr = RSX_MAX_RECV_WR; /* BUG: rdma-queue-cap-unchecked -- 4096 receive WRs without comparing with attrs.max_qp_wr */
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	p->qp = ib_create_qp(p->pd, &attr);
	if (IS_ERR(p->qp))
		return PTR_ERR(p->qp);
	return 0;
}

static void rsx_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rsx_path *p = container_of(wc->wr_cqe, struct rsx_path, reg_cqe);

	complete(&p->reg_done);
}

static void rsx_unmap_chunks(struct rsx_path *p, u32 n)
{
	while (n--)
		/* BUG: rdma-local-mr-management -- the server deregisters its chunk MRs */
		ib_dereg_mr(p->chunk_mrs[n]); /* OK: rdma-invalidation-leak -- deregistration kills the client's keys */
}

int rsx_map_chunks(struct rsx_path *p, struct rsx_info_rsp *rsp)
{
	struct ib_reg_wr reg_wr;
	struct ib_send_wr rsp_wr = { };
	struct ib_sge sge;
	u32 i;
	int ret;

	for (i = 0; i < p->queue_depth; i++) {
		struct ib_mr *mr;

		/* BUG: rdma-local-mr-management -- the server allocates an MR per chunk */
		mr = ib_alloc_mr(p->pd, IB_MR_TYPE_MEM_REG, RSX_CHUNK_PAGES); /* OK: rdma-registration-in-datapath -- path setup, once per chunk for the path's lifetime */
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto err;
		}
		p->chunk_mrs[i] = mr;
		/* BUG: rdma-local-mr-management -- the server maps the chunk into its MR */
		if (ib_map_mr_sg(mr, p->chunk_sgt[i].sgl, p->chunk_sgt[i].nents,
				 NULL, SZ_4K) != p->chunk_sgt[i].nents) {
			i++;
			ret = -EINVAL;
			goto err;
		}

		memset(&reg_wr, 0, sizeof(reg_wr));
		reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the server */
		reg_wr.wr.wr_cqe = &p->reg_cqe;
		reg_wr.mr = mr; /* OK: rdma-rkey-reuse -- each chunk MR is registered once for the path */
		reg_wr.key = mr->rkey;
		reg_wr.access = IB_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE: the REG_MR fails */
		if (i == p->queue_depth - 1) {
			reg_wr.wr.send_flags = IB_SEND_SIGNALED;
			p->reg_cqe.done = rsx_reg_done;
			init_completion(&p->reg_done);
		}
		ret = ib_post_send(p->qp, &reg_wr.wr, NULL);
		if (ret) {
			i++;
			goto err;
		}
		rsp->desc[i].addr = cpu_to_be64(mr->iova);
		rsp->desc[i].key = cpu_to_be32(mr->rkey);
		rsp->desc[i].len = cpu_to_be32(mr->length);
	}
	wait_for_completion(&p->reg_done);

	rsp->sg_cnt = cpu_to_be16(p->queue_depth);
	sge.addr = p->info_rsp_dma;
	sge.length = sizeof(*rsp) + p->queue_depth * sizeof(rsp->desc[0]);
	sge.lkey = p->pd->local_dma_lkey;
	rsp_wr.opcode = IB_WR_SEND;
	rsp_wr.sg_list = &sge;
	rsp_wr.num_sge = 1;
	rsp_wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(p->qp, &rsp_wr, NULL);

err:
	rsx_unmap_chunks(p, i); /* OK: rdma-mr-leak -- every chunk MR allocated so far is deregistered */
	return ret;
}

void rsx_close_path(struct rsx_path *p)
{
	ib_drain_qp(p->qp);
	rsx_unmap_chunks(p, p->queue_depth);
	ib_destroy_qp(p->qp);
}
