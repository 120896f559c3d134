// RUN: %check_ulplint --kernel %s rdma-remote-access-overbroad %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-remote-access-overbroad %t.plugin

// Kernel: the PD's unsafe global rkey, and fast registrations with remote
// rights whose rkey is never sent.

#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <linux/unaligned.h>

struct demo_dev {
	struct ib_device *ibdev;
	struct ib_pd *pd;
	bool trusted_fabric;
};

struct demo_sgl_desc {
	u8 addr[8];
	u8 length[3];
	u8 key[4];
};

struct demo_request {
	struct ib_mr *mr;
	struct ib_mr *scratch_mr;
	struct ib_reg_wr reg_wr;
	struct ib_reg_wr scratch_reg;
	struct ib_send_wr inv_wr;
	struct demo_sgl_desc *desc;
};

static int demo_alloc_pd(struct demo_dev *dev)
{
	unsigned int flags = 0;

	if (dev->trusted_fabric)
		flags |= IB_PD_UNSAFE_GLOBAL_RKEY;
	dev->pd = ib_alloc_pd(dev->ibdev, flags);
	// CHECK-MESSAGES: :[[@LINE-1]]:36: warning: IB_PD_UNSAFE_GLOBAL_RKEY gives any peer that learns the PD's global rkey remote read and write access to all of memory; register per I/O with rdma_rw or a registration context instead [rdma-remote-access-overbroad]
	return dev->pd ? 0 : -ENOMEM;
}

/* The scratch MR gets remote read rights, but only its lkey is ever used. */
static void demo_reg_scratch(struct demo_request *req)
{
	req->scratch_reg.wr.opcode = IB_WR_REG_MR;
	req->scratch_reg.mr = req->scratch_mr;
	req->scratch_reg.key = req->scratch_mr->rkey;
	req->scratch_reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'IB_WR_REG_MR' grants IB_ACCESS_REMOTE_READ but the MR's rkey never leaves this translation unit; no peer can use these rights, drop them [rdma-remote-access-overbroad]
}

static void demo_inv_scratch(struct demo_request *req)
{
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.ex.invalidate_rkey = req->scratch_mr->rkey;
	ib_update_fast_reg_key(req->scratch_mr, ib_inc_rkey(req->scratch_mr->rkey));
}

/* Near misses. */

/* nvme-rdma: the rkey is written into the command's SGL descriptor. */
static void ok_nvme_style(struct demo_request *req)
{
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;
	put_unaligned_le32(req->mr->rkey, req->desc->key);
}

static int ok_safe_pd(struct demo_dev *dev)
{
	dev->pd = ib_alloc_pd(dev->ibdev, 0);
	return dev->pd ? 0 : -ENOMEM;
}

/* One transfer MR that serves two roles. As the sink of the server's RDMA
 * READs it needs REMOTE_WRITE on iWARP, where the READ request carries its
 * key to the responder: demo_xfer_pull() registers it that way before it
 * posts the READ. demo_xfer_reg_reply() registers it as the source of an
 * RDMA WRITE: no READ of its own lands there, and its key never leaves. */
struct demo_xfer {
	struct ib_device *ibdev;
	u32 port_num;
	struct ib_qp *qp;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_rdma_wr rdma_wr;
	struct ib_sge sge;
	struct scatterlist *sgl;
	int nents;
};

static int demo_xfer_reg_sink(struct demo_xfer *x)
{
	if (ib_map_mr_sg(x->mr, x->sgl, x->nents, NULL, SZ_4K) != x->nents)
		return -EINVAL;
	ib_update_fast_reg_key(x->mr, ib_inc_rkey(x->mr->rkey));
	x->reg_wr.wr.opcode = IB_WR_REG_MR;
	x->reg_wr.mr = x->mr;
	x->reg_wr.key = x->mr->rkey;
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	if (rdma_protocol_iwarp(x->ibdev, x->port_num))
		x->reg_wr.access |= IB_ACCESS_REMOTE_WRITE;
	return 0;
}

int demo_xfer_pull(struct demo_xfer *x, u64 raddr, u32 rkey)
{
	int ret = demo_xfer_reg_sink(x);

	if (ret)
		return ret;
	x->sge.addr = x->mr->iova;
	x->sge.length = x->mr->length;
	x->sge.lkey = x->mr->lkey;
	x->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	x->rdma_wr.wr.sg_list = &x->sge;
	x->rdma_wr.wr.num_sge = 1;
	x->rdma_wr.remote_addr = raddr;
	x->rdma_wr.rkey = rkey;
	x->reg_wr.wr.next = &x->rdma_wr.wr;
	return ib_post_send(x->qp, &x->reg_wr.wr, NULL);
}

int demo_xfer_reg_reply(struct demo_xfer *x)
{
	bool iw = rdma_protocol_iwarp(x->ibdev, x->port_num);

	if (ib_map_mr_sg(x->mr, x->sgl, x->nents, NULL, SZ_4K) != x->nents)
		return -EINVAL;
	ib_update_fast_reg_key(x->mr, ib_inc_rkey(x->mr->rkey));
	x->reg_wr.wr.opcode = IB_WR_REG_MR;
	x->reg_wr.mr = x->mr;
	x->reg_wr.key = x->mr->rkey;
	x->reg_wr.access = iw ? IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
				IB_ACCESS_LOCAL_WRITE;
	// CHECK-MESSAGES: :[[@LINE-2]]:2: warning: 'IB_WR_REG_MR' grants IB_ACCESS_REMOTE_WRITE but the MR's rkey never leaves this translation unit; no peer can use these rights, drop them [rdma-remote-access-overbroad]
	return 0;
}
