// SPDX-License-Identifier: GPL-2.0
/*
 * hfs: the buffer-registration code of an invented HPC parallel-filesystem
 * client ("hfs"). Access flags are built in several styles, and three of
 * them lose LOCAL_WRITE:
 *
 *   - hfs_reg_read_buf() starts from REMOTE_READ and adds REMOTE_WRITE when
 *     the server may write back, without LOCAL_WRITE (wrong on that path);
 *   - hfs_reg_ternary() picks REMOTE_WRITE alone for the writable case;
 *   - hfs_reg_alias() fills the work request through a pointer alias and
 *     sets REMOTE_WRITE | REMOTE_READ.
 *
 * hfs_reg_fixed() builds its flags over several statements too and always
 * adds LOCAL_WRITE when REMOTE_WRITE is requested, which is right. Keys are
 * rotated and every rkey is written into the request descriptor.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>

struct hfs_buf {
	struct ib_qp		*qp;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct scatterlist	*sgl;
	int			nents;
	bool			server_writes;
	bool			server_reads;
	u8			desc[12];
};

static int hfs_map(struct hfs_buf *b)
{
	/* BUG: rdma-local-mr-management -- the client maps the buffer into its MR */
	if (ib_map_mr_sg(b->mr, b->sgl, b->nents, NULL, SZ_4K) != b->nents)
		return -EINVAL;
	ib_update_fast_reg_key(b->mr, ib_inc_rkey(b->mr->rkey));
	memset(&b->reg_wr, 0, sizeof(b->reg_wr));
	b->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	b->reg_wr.mr = b->mr;
	b->reg_wr.key = b->mr->rkey;
	put_unaligned_le64(b->mr->iova, b->desc);
	put_unaligned_le32(b->mr->rkey, b->desc + 8);
	return 0;
}

int hfs_reg_read_buf(struct hfs_buf *b)
{
	int access = IB_ACCESS_REMOTE_READ;
	int ret = hfs_map(b);

	if (ret)
		return ret;
	if (b->server_writes)
		access |= IB_ACCESS_REMOTE_WRITE;
	b->reg_wr.access = access; /* BUG: rdma-access-flags-invalid -- when the server writes back, REMOTE_WRITE is requested without LOCAL_WRITE */
	return ib_post_send(b->qp, &b->reg_wr.wr, NULL);
}

int hfs_reg_ternary(struct hfs_buf *b)
{
	int ret = hfs_map(b);

	if (ret)
		return ret;
	/* BUG: rdma-access-flags-invalid -- the writable branch has REMOTE_WRITE alone */
	b->reg_wr.access = b->server_writes ? IB_ACCESS_REMOTE_WRITE :
					      IB_ACCESS_REMOTE_READ;
	return ib_post_send(b->qp, &b->reg_wr.wr, NULL);
}

int hfs_reg_alias(struct hfs_buf *b)
{
	struct ib_reg_wr *reg = &b->reg_wr;
	int ret = hfs_map(b);

	if (ret)
		return ret;
	reg->access = IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ; /* BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE, set through an alias of b->reg_wr */
	return ib_post_send(b->qp, &reg->wr, NULL);
}

int hfs_reg_fixed(struct hfs_buf *b)
{
	int access = 0;
	int ret = hfs_map(b);

	if (ret)
		return ret;
	if (b->server_reads)
		access |= IB_ACCESS_REMOTE_READ;
	if (b->server_writes) {
		access |= IB_ACCESS_REMOTE_WRITE;
		access |= IB_ACCESS_LOCAL_WRITE;
	}
	b->reg_wr.access = access; /* OK: rdma-access-flags-invalid -- every path that adds REMOTE_WRITE also adds LOCAL_WRITE */
	return ib_post_send(b->qp, &b->reg_wr.wr, NULL);
}
