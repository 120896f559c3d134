// SPDX-License-Identifier: GPL-2.0
/*
 * isx iser_verbs.c: device, QP and fast-registration pool (see isx.h).
 *
 * Like iSER before always-register became the only mode, the PD gets
 * IB_PD_UNSAFE_GLOBAL_RKEY when the "always_register" module parameter is
 * cleared (single-entry commands then use the global rkey): one key for all
 * of kernel memory. The send queue is sized per command for the LOCAL_INV,
 * REG_MR and SEND a command can keep outstanding, plus the miscellaneous
 * PDUs and one for the drain, and the command count is clamped to the
 * device's max_qp_wr: enough, through the hand-made factor that
 * cap.max_rdma_ctxs would replace. The descriptor pool unwinds correctly.
 */
#include "isx.h"

static bool always_register = true;
module_param(always_register, bool, 0644);

int isx_create_device(struct isx_device *device, struct ib_device *ibdev)
{
	device->ib_device = ibdev;
	/* BUG: rdma-remote-access-overbroad -- with always_register cleared the PD carries a global rkey for all of memory */
	device->pd = ib_alloc_pd(ibdev, always_register ? 0 : IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(device->pd))
		return PTR_ERR(device->pd);
	return 0;
}

static void isx_free_fr_pool(struct isx_conn *conn)
{
	struct isx_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &conn->fr_list, list) {
		list_del(&desc->list);
		/* BUG: rdma-local-mr-management -- the initiator deregisters its own MRs */
		ib_dereg_mr(desc->mr); /* OK: rdma-invalidation-leak -- deregistration kills whatever key is still valid */
		kfree(desc);
	}
}

static int isx_alloc_fr_pool(struct isx_conn *conn)
{
	struct isx_fr_desc *desc;
	u32 i;

	INIT_LIST_HEAD(&conn->fr_list);
	spin_lock_init(&conn->lock);
	for (i = 0; i < conn->cmds_max; i++) {
		desc = kzalloc(sizeof(*desc), GFP_KERNEL);
		if (!desc)
			goto err;
		/* BUG: rdma-local-mr-management -- the initiator allocates its own FR MRs */
		desc->mr = ib_alloc_mr(conn->device->pd, IB_MR_TYPE_MEM_REG,
				       conn->max_pages); /* OK: rdma-registration-in-datapath -- connection setup */
		if (IS_ERR(desc->mr)) {
			kfree(desc);
			goto err;
		}
		list_add_tail(&desc->list, &conn->fr_list);
	}
	return 0;
err:
	isx_free_fr_pool(conn); /* OK: rdma-mr-leak -- every MR on fr_list is deregistered */
	return -ENOMEM;
}

int isx_create_ib_conn_res(struct isx_conn *conn)
{
	struct isx_device *device = conn->device;
	struct ib_device *ibdev = device->ib_device;
	struct ib_qp_init_attr init_attr;
	u32 misc = ISX_MAX_TX_MISC_PDUS + 1;
	int ret;

	if (ISX_WRS_PER_CMD * conn->cmds_max + misc > ibdev->attrs.max_qp_wr)
		conn->cmds_max = (ibdev->attrs.max_qp_wr - misc) / ISX_WRS_PER_CMD;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_context = conn;
	init_attr.send_cq = conn->cq;
	init_attr.recv_cq = conn->cq;
	/* BUG: rdma-send-queue-manual-factor -- the command count times a hand-made INV+REG+SEND factor */
	init_attr.cap.max_send_wr = ISX_WRS_PER_CMD * conn->cmds_max + misc; /* OK: rdma-send-queue-undersized, rdma-queue-cap-unchecked -- three WRs per command, the misc PDUs and a drain entry, clamped to max_qp_wr above */
	init_attr.cap.max_recv_wr = conn->cmds_max + ISX_MAX_RX_MISC_PDUS;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every ISX_SIGNAL_CMD_COUNT-th command SEND is signaled (iser_initiator.c) */
	init_attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(conn->cma_id, device->pd, &init_attr);
	if (ret)
		return ret;
	conn->qp = conn->cma_id->qp;

	ret = isx_alloc_fr_pool(conn);
	if (ret)
		rdma_destroy_qp(conn->cma_id);
	return ret;
}

void isx_free_ib_conn_res(struct isx_conn *conn)
{
	ib_drain_qp(conn->qp);
	isx_free_fr_pool(conn);
	rdma_destroy_qp(conn->cma_id);
}

struct isx_fr_desc *isx_reg_desc_get(struct isx_conn *conn)
{
	struct isx_fr_desc *desc;
	unsigned long flags;

	spin_lock_irqsave(&conn->lock, flags);
	desc = list_first_entry_or_null(&conn->fr_list, struct isx_fr_desc, list);
	if (desc)
		list_del(&desc->list);
	spin_unlock_irqrestore(&conn->lock, flags);
	return desc;
}

void isx_reg_desc_put(struct isx_conn *conn, struct isx_fr_desc *desc)
{
	unsigned long flags;

	spin_lock_irqsave(&conn->lock, flags);
	list_add(&desc->list, &conn->fr_list);
	spin_unlock_irqrestore(&conn->lock, flags);
}
