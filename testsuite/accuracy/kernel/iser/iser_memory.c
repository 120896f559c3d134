// SPDX-License-Identifier: GPL-2.0
/*
 * isx iser_memory.c: registration of a task's data buffer (see isx.h).
 *
 * Registration is right: a descriptor that is still registered gets a
 * LOCAL_INV chained in front of its REG_MR, the key is rotated every time,
 * and the flags carry LOCAL_WRITE. Unregistration is the upstream iSER
 * scheme: when the target did not invalidate the key remotely the
 * descriptor is simply returned to the pool with mr_valid set, and its key
 * dies only when the descriptor is used again. Until then the target still
 * holds a working rkey for pages the SCSI midlayer has been given back
 * (iser_initiator.c unmaps them right after). This is the invalidation-leak
 * the check describes, in real code.
 */
#include "isx.h"

static void isx_inv_rkey(struct ib_send_wr *inv_wr, struct ib_mr *mr,
			 struct ib_cqe *cqe, struct ib_send_wr *next_wr)
{
	inv_wr->opcode = IB_WR_LOCAL_INV;
	inv_wr->wr_cqe = cqe;
	inv_wr->ex.invalidate_rkey = mr->rkey;
	inv_wr->send_flags = 0;
	inv_wr->num_sge = 0;
	inv_wr->next = next_wr;
}

static int isx_fast_reg_mr(struct isx_task *task, enum isx_data_dir dir,
			   struct isx_fr_desc *desc)
{
	struct isx_tx_desc *tx_desc = &task->desc;
	struct isx_mem_reg *reg = &task->rdma_reg[dir];
	struct ib_cqe *cqe = &task->conn->reg_cqe;
	struct ib_reg_wr *wr = &tx_desc->reg_wr;
	struct ib_mr *mr = desc->mr;
	int n;

	if (desc->mr_valid)
		isx_inv_rkey(&tx_desc->inv_wr, mr, cqe, &wr->wr);
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));

	/* BUG: rdma-local-mr-management -- the initiator maps the task's pages into its MR */
	n = ib_map_mr_sg(mr, task->sg[dir], task->dma_nents[dir], NULL, SZ_4K);
	if (unlikely(n != task->dma_nents[dir]))
		return n < 0 ? n : -EINVAL;

	wr->wr.next = &tx_desc->send_wr;
	wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the initiator */
	wr->wr.wr_cqe = cqe;
	wr->wr.send_flags = 0;
	wr->wr.num_sge = 0;
	wr->mr = mr; /* OK: rdma-rkey-reuse -- rotated on every path, whether or not a LOCAL_INV was chained */
	wr->key = mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
		     IB_ACCESS_REMOTE_READ; /* OK: rdma-access-flags-invalid -- LOCAL_WRITE accompanies REMOTE_WRITE */
	desc->mr_valid = true;

	reg->sge.lkey = mr->lkey;
	reg->rkey = mr->rkey;
	reg->sge.addr = mr->iova;
	reg->sge.length = mr->length;
	reg->desc = desc;
	return 0;
}

int isx_reg_rdma_mem(struct isx_task *task, enum isx_data_dir dir)
{
	struct isx_conn *conn = task->conn;
	struct isx_fr_desc *desc;
	int ret;

	desc = isx_reg_desc_get(conn);
	if (!desc)
		return -EAGAIN;
	ret = isx_fast_reg_mr(task, dir, desc);
	if (ret) {
		isx_reg_desc_put(conn, desc); /* OK: rdma-invalidation-leak -- nothing was posted for this registration */
		return ret;
	}
	return 0;
}

int isx_inv_desc(struct isx_fr_desc *desc, u32 rkey)
{
	if (unlikely(desc->mr->rkey != rkey)) {
		pr_err("isx: bogus remote invalidation for rkey %#x\n", rkey);
		return -EINVAL;
	}
	desc->mr_valid = false;
	return 0;
}

void isx_unreg_mem(struct isx_task *task, enum isx_data_dir dir)
{
	struct isx_mem_reg *reg = &task->rdma_reg[dir];
	struct isx_fr_desc *desc = reg->desc;

	if (!desc)
		return;
	/* BUG: rdma-invalidation-leak -- when the target did not invalidate remotely (mr_valid still set) the descriptor returns to the pool with a working rkey; it is invalidated only at its next use */
	isx_reg_desc_put(task->conn, desc);
	reg->desc = NULL;
}
