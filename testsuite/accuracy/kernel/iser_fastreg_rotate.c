// SPDX-License-Identifier: GPL-2.0
/*
 * isr: fast registration of an iSER-style initiator (modelled on
 * drivers/infiniband/ulp/iser/iser_memory.c, written fresh).
 *
 * Each connection owns a list of fast-registration descriptors, each with an
 * MR allocated at connection setup. A descriptor stays registered after its
 * command ("mr_valid"); when it is reused, a LOCAL_INV is chained in front of
 * the REG_MR. The target usually invalidates remotely (SEND_WITH_INV); the
 * receive path compares the invalidated rkey in a helper before clearing
 * mr_valid.
 *
 * The bug: the key is rotated only inside the "mr_valid" branch. After a
 * remote invalidation the descriptor is registered again with the very same
 * rkey, so a target that kept the old key reaches the new command's buffer
 * (upstream rotates unconditionally). Setup unwinds its MRs correctly.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <rdma/ib_verbs.h>

#define ISR_RSV			0x04
#define ISR_WSV			0x08

struct isr_fr_desc {
	struct list_head	list;
	struct ib_mr		*mr;
	bool			mr_valid;
};

struct isr_mem_reg {
	struct ib_sge		sge;
	u32			rkey;
	struct isr_fr_desc	*desc;
};

struct isr_tx_desc {
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
};

struct isr_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cqe		reg_cqe;
	spinlock_t		lock;
	struct list_head	fr_list;
	unsigned int		max_sectors_pages;
};

struct isr_task {
	struct isr_conn		*conn;
	struct isr_tx_desc	desc;
	struct isr_mem_reg	rdma_reg[2];
	struct scatterlist	*sg;
	int			dma_nents;
};

struct isr_hdr {
	u8	flags;
	u32	itt;
};

struct isr_task *isr_itt_to_task(struct isr_conn *conn, u32 itt);

static void isr_reg_comp(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("isr: registration failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

int isr_alloc_fr_pool(struct isr_conn *conn, unsigned int cmds_max)
{
	struct isr_fr_desc *desc, *tmp;
	unsigned int i;
	int ret;

	INIT_LIST_HEAD(&conn->fr_list);
	conn->reg_cqe.done = isr_reg_comp;
	for (i = 0; i < cmds_max; i++) {
		desc = kzalloc(sizeof(*desc), GFP_KERNEL);
		if (!desc) {
			ret = -ENOMEM;
			goto err;
		}
		/* BUG: rdma-local-mr-management -- the ULP allocates fast-registration MRs itself */
		desc->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
				       conn->max_sectors_pages); /* OK: rdma-registration-in-datapath -- allocated once per connection */
		if (IS_ERR(desc->mr)) {
			ret = PTR_ERR(desc->mr);
			kfree(desc);
			goto err;
		}
		list_add_tail(&desc->list, &conn->fr_list);
	}
	return 0;

err:
	list_for_each_entry_safe(desc, tmp, &conn->fr_list, list) {
		list_del(&desc->list);
		/* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		ib_dereg_mr(desc->mr); /* OK: rdma-mr-leak -- every MR taken so far is released on the unwinding path */
		kfree(desc);
	}
	return ret;
}

void isr_free_fr_pool(struct isr_conn *conn)
{
	struct isr_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &conn->fr_list, list) {
		list_del(&desc->list);
		/* BUG: rdma-local-mr-management -- teardown of the ULP's own MRs */
		ib_dereg_mr(desc->mr); /* OK: rdma-invalidation-leak -- deregistration kills whatever key is still valid */
		kfree(desc);
	}
}

static void isr_inv_rkey(struct ib_send_wr *inv_wr, struct ib_mr *mr,
			 struct ib_cqe *cqe, struct ib_send_wr *next_wr)
{
	inv_wr->opcode = IB_WR_LOCAL_INV;
	inv_wr->wr_cqe = cqe;
	inv_wr->ex.invalidate_rkey = mr->rkey;
	inv_wr->send_flags = 0;
	inv_wr->num_sge = 0;
	inv_wr->next = next_wr;
}

int isr_fast_reg_mr(struct isr_task *task, struct isr_fr_desc *desc,
		    struct isr_mem_reg *reg)
{
	struct isr_tx_desc *tx_desc = &task->desc;
	struct ib_cqe *cqe = &task->conn->reg_cqe;
	struct ib_mr *mr = desc->mr;
	struct ib_reg_wr *wr = &tx_desc->reg_wr;
	int n;

	if (desc->mr_valid) {
		isr_inv_rkey(&tx_desc->inv_wr, mr, cqe, &wr->wr);
		ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	}

	/* BUG: rdma-local-mr-management -- the ULP maps the command's pages into its MR */
	n = ib_map_mr_sg(mr, task->sg, task->dma_nents, NULL, SZ_4K);
	if (unlikely(n != task->dma_nents)) {
		pr_err("failed to map sg (%d/%d)\n", n, task->dma_nents);
		return n < 0 ? n : -EINVAL;
	}

	wr->wr.next = &tx_desc->send_wr;
	wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the ULP */
	wr->wr.wr_cqe = cqe;
	wr->wr.send_flags = 0;
	wr->wr.num_sge = 0;
	wr->mr = mr; /* BUG: rdma-rkey-reuse -- after a remote invalidation (mr_valid cleared) the MR is registered again with its old key */
	wr->key = mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is there, and the rkey travels in the iSER header */
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
		     IB_ACCESS_REMOTE_READ;

	desc->mr_valid = true;
	reg->sge.lkey = mr->lkey;
	reg->rkey = mr->rkey;
	reg->sge.addr = mr->iova;
	reg->sge.length = mr->length;
	reg->desc = desc;
	return 0;
}

static int isr_inv_desc(struct isr_fr_desc *desc, u32 rkey)
{
	if (unlikely(desc->mr->rkey != rkey)) {
		pr_err("Bogus remote invalidation for rkey %#x\n", rkey);
		return -EINVAL;
	}
	desc->mr_valid = false;
	return 0;
}

int isr_check_remote_inv(struct isr_conn *conn, struct ib_wc *wc,
			 struct isr_hdr *hdr)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is handed to isr_inv_desc(), which compares it */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		u32 rkey = wc->ex.invalidate_rkey;
		struct isr_task *task = isr_itt_to_task(conn, hdr->itt);
		struct isr_fr_desc *desc;

		if (!task)
			return -EINVAL;
		if (hdr->flags & ISR_RSV) {
			desc = task->rdma_reg[0].desc;
			if (desc && isr_inv_desc(desc, rkey))
				return -EINVAL;
		}
		if (hdr->flags & ISR_WSV) {
			desc = task->rdma_reg[1].desc;
			if (desc && isr_inv_desc(desc, rkey))
				return -EINVAL;
		}
	}
	return 0;
}
