// SPDX-License-Identifier: GPL-2.0
/*
 * sb_rtrs_core.c - RTRS style transport: per-connection CQ/QP setup and
 * teardown, and the small posting helpers shared by the I/O path.
 *
 * Every connection of a path gets its own QP.  The admin connection only
 * carries the info exchange and heartbeats; the I/O connections are sized
 * for the whole path queue depth, since any permit may be sent on any of
 * them.  Problem in this version: the I/O send queue budget assumes the
 * server always invalidates the client's rkey, but the client posts its
 * own LOCAL_INV whenever it did not (sb_rtrs_clt.c).
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this program
 */
#include <linux/module.h>
#include "sb_rtrs_pri.h"

#define SBR_IMM_TYPE_BITS	4
#define SBR_IMM_PAYL_MASK	((1u << (32 - SBR_IMM_TYPE_BITS)) - 1)

u32 sbr_to_imm(u32 type, u32 payload)
{
	return (type << (32 - SBR_IMM_TYPE_BITS)) | (payload & SBR_IMM_PAYL_MASK);
}

void sbr_from_imm(u32 imm, u32 *type, u32 *payload)
{
	*type = imm >> (32 - SBR_IMM_TYPE_BITS);
	*payload = imm & SBR_IMM_PAYL_MASK;
}

void sbr_err_recovery(struct sbr_path *path)
{
	queue_work(system_wq, &path->err_recovery_work);
}

static void sbr_qp_event_handler(struct ib_event *ev, void *ctx)
{
}

int sbr_con_create_qp(struct sbr_con *con)
{
	struct sbr_path *path = con->path;
	struct ib_qp_init_attr init_attr;
	int err;

	memset(&init_attr, 0, sizeof(init_attr));
	if (con->cid == 0) {
		/* OK: rdma-send-queue-manual-factor -- a fixed message budget for the admin connection, which posts no registrations */
		init_attr.cap.max_send_wr = 2 * SBR_ADMIN_MSGS + 1; /* OK: rdma-send-queue-undersized -- the admin QP only carries info and heartbeat messages, no I/O */
		init_attr.cap.max_recv_wr = 2 * SBR_ADMIN_MSGS + 1;
	} else {
		/* BUG: rdma-send-queue-manual-factor -- per-permit factor for the registration WRs chosen by hand */
		init_attr.cap.max_send_wr = path->queue_depth * SBR_WRS_PER_IO + 1; /* BUG(program): rdma-send-queue-undersized -- a READ permit posts REG_MR, the request and, when the server did not invalidate, a LOCAL_INV: 3 entries, not 2 */
		init_attr.cap.max_recv_wr = path->queue_depth + 1;
	}
	con->cq_size = init_attr.cap.max_send_wr + init_attr.cap.max_recv_wr;
	con->cq = ib_cq_pool_get(path->ibdev, con->cq_size, con->cid,
				 IB_POLL_SOFTIRQ);
	if (IS_ERR(con->cq))
		return PTR_ERR(con->cq);

	init_attr.event_handler = sbr_qp_event_handler;
	init_attr.qp_context = con;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = con->cq;
	init_attr.recv_cq = con->cq;

	err = rdma_create_qp(con->cm_id, path->pd, &init_attr);
	if (err) {
		ib_cq_pool_put(con->cq, con->cq_size);
		return err;
	}
	con->qp = con->cm_id->qp;
	return 0;
}

void sbr_con_destroy_qp(struct sbr_con *con)
{
	ib_drain_qp(con->qp);
	rdma_destroy_qp(con->cm_id);
	con->qp = NULL;
	ib_cq_pool_put(con->cq, con->cq_size);
}

int sbr_post_local_inv(struct sbr_con *con, struct ib_cqe *cqe, u32 rkey,
		       bool signal)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = cqe,
		.send_flags	    = signal ? IB_SEND_SIGNALED : 0,
		.ex.invalidate_rkey = rkey,
	};

	return ib_post_send(con->qp, &wr, NULL);
}

int sbr_iu_post_recv(struct sbr_con *con, struct sbr_iu *iu)
{
	struct ib_sge sge = {
		.addr	= iu->dma_addr,
		.length	= iu->size,
		.lkey	= con->path->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_cqe	 = &iu->cqe,
		.sg_list = &sge,
		.num_sge = 1,
	};

	return ib_post_recv(con->qp, &wr, NULL);
}

static void sbr_hb_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbr_con *con = container_of(wc->wr_cqe, struct sbr_con, hb_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		sbr_err_recovery(con->path);
}

int sbr_send_hb(struct sbr_con *con)
{
	struct ib_rdma_wr wr;

	memset(&wr, 0, sizeof(wr));
	con->hb_cqe.done = sbr_hb_done;
	wr.wr.wr_cqe = &con->hb_cqe;
	wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.wr.ex.imm_data = cpu_to_be32(sbr_to_imm(SBR_HB_MSG_IMM, 0));

	return ib_post_send(con->qp, &wr.wr, NULL);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb RTRS style transport core");
