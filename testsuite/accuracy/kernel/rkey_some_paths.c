// SPDX-License-Identifier: GPL-2.0
/*
 * nvd: the registration helpers of an invented NVMe-over-RDMA-like "nvd"
 * initiator that keeps one MR per request slot (allocated with the slot,
 * reused for every command of that slot, invalidated at the end of each
 * command).
 *
 * nvd_reg_data() rotates the key only when the command is being retried;
 * a first attempt re-registers the slot's MR with the key of the previous
 * command. nvd_reg_meta() "rotates" with ib_update_fast_reg_key(mr, key)
 * where key is the current low byte: a no-op. nvd_reg_sense() advances the
 * key on every path, which is right.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>

struct nvd_slot {
	struct ib_qp		*qp;
	struct ib_mr		*data_mr;
	struct ib_mr		*meta_mr;
	struct ib_mr		*sense_mr;
	struct ib_reg_wr	reg_wr[3];
	struct scatterlist	*data_sg;
	struct scatterlist	*meta_sg;
	struct scatterlist	*sense_sg;
	int			data_nents;
	int			meta_nents;
	int			retries;
	u8			data_key[4];
	u8			meta_key[4];
	u8			sense_key[4];
};

int nvd_reg_data(struct nvd_slot *s)
{
	struct ib_reg_wr *wr = &s->reg_wr[0];

	/* BUG: rdma-local-mr-management -- the initiator maps data into its MR */
	if (ib_map_mr_sg(s->data_mr, s->data_sg, s->data_nents, NULL,
			 SZ_4K) != s->data_nents)
		return -EINVAL;

	if (s->retries)
		ib_update_fast_reg_key(s->data_mr,
				       ib_inc_rkey(s->data_mr->rkey));

	memset(wr, 0, sizeof(*wr));
	wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the initiator */
	wr->mr = s->data_mr; /* BUG: rdma-rkey-reuse -- only a retried command gets a new key; a first attempt reuses the previous command's rkey */
	wr->key = s->data_mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
		     IB_ACCESS_REMOTE_READ;
	put_unaligned_le32(s->data_mr->rkey, s->data_key);
	return 0;
}

int nvd_reg_meta(struct nvd_slot *s)
{
	struct ib_reg_wr *wr = &s->reg_wr[1];
	u8 key = s->meta_mr->rkey & 0xff;

	/* BUG: rdma-local-mr-management -- the initiator maps metadata into its MR */
	if (ib_map_mr_sg(s->meta_mr, s->meta_sg, s->meta_nents, NULL,
			 SZ_4K) != s->meta_nents)
		return -EINVAL;

	ib_update_fast_reg_key(s->meta_mr, key);

	memset(wr, 0, sizeof(*wr));
	wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the initiator */
	wr->mr = s->meta_mr; /* BUG: rdma-rkey-reuse -- the "update" writes back the current key byte, so the key never changes */
	wr->key = s->meta_mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
		     IB_ACCESS_REMOTE_READ;
	put_unaligned_le32(s->meta_mr->rkey, s->meta_key);
	return 0;
}

int nvd_reg_sense(struct nvd_slot *s)
{
	struct ib_reg_wr *wr = &s->reg_wr[2];

	/* BUG: rdma-local-mr-management -- the initiator maps the sense buffer into its MR */
	if (ib_map_mr_sg(s->sense_mr, s->sense_sg, 1, NULL, SZ_4K) != 1)
		return -EINVAL;

	ib_update_fast_reg_key(s->sense_mr, ib_inc_rkey(s->sense_mr->rkey));

	memset(wr, 0, sizeof(*wr));
	wr->wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the initiator */
	wr->mr = s->sense_mr; /* OK: rdma-rkey-reuse -- the key is advanced on every path */
	wr->key = s->sense_mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- LOCAL_WRITE with REMOTE_WRITE */
	put_unaligned_le32(s->sense_mr->rkey, s->sense_key);
	return 0;
}

void nvd_inv_slot(struct nvd_slot *s, struct ib_send_wr *inv, u32 rkey)
{
	inv->opcode = IB_WR_LOCAL_INV;
	inv->next = NULL;
	inv->num_sge = 0;
	inv->send_flags = IB_SEND_SIGNALED;
	inv->ex.invalidate_rkey = rkey;
	if (ib_post_send(s->qp, inv, NULL))
		pr_err("nvd: LOCAL_INV of %#x failed\n", rkey);
}
