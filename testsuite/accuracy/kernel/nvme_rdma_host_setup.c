// SPDX-License-Identifier: GPL-2.0
/*
 * nvs: device setup of an NVMe/RDMA-style host and its single-SGE fast path.
 *
 * Like nvme-rdma before register_always became the only mode, the host can
 * skip memory registration for single-segment commands and hand the
 * controller the PD's global rkey instead: ib_alloc_pd() with
 * IB_PD_UNSAFE_GLOBAL_RKEY when the "register_always" module parameter is
 * cleared. That rkey covers all of kernel memory, for any peer that learns
 * it. Commands that fit in the capsule use the PD's local_dma_lkey, which
 * the controller never sees; the discovery PD is allocated without flags.
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>

#define NVS_MAX_INLINE_SEGMENTS	4

static bool register_always = true;
module_param(register_always, bool, 0444);
MODULE_PARM_DESC(register_always,
		 "Use memory registration even for contiguous memory regions");

struct nvs_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct list_head	entry;
	u32			num_inline_segments;
};

struct nvs_sgl_desc {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct nvs_request {
	struct ib_sge		sge[1 + NVS_MAX_INLINE_SEGMENTS];
	u32			num_sge;
	struct scatterlist	*sgl;
};

static LIST_HEAD(nvs_device_list);

struct nvs_device *nvs_alloc_device(struct ib_device *ibdev)
{
	struct nvs_device *ndev;

	ndev = kzalloc(sizeof(*ndev), GFP_KERNEL);
	if (!ndev)
		return NULL;
	ndev->dev = ibdev;

	/* BUG: rdma-remote-access-overbroad -- without register_always the PD carries one rkey for all of kernel memory, sent to the controller for single-segment I/O */
	ndev->pd = ib_alloc_pd(ibdev, register_always ? 0 : IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(ndev->pd))
		goto out_free_dev;

	if (!(ibdev->attrs.device_cap_flags & IB_DEVICE_MEM_MGT_EXTENSIONS)) {
		pr_err("memory registrations not supported on %s\n",
		       ibdev->name);
		goto out_free_pd;
	}

	ndev->num_inline_segments = min(NVS_MAX_INLINE_SEGMENTS,
					ibdev->attrs.max_send_sge - 1);
	list_add(&ndev->entry, &nvs_device_list);
	return ndev;

out_free_pd:
	ib_dealloc_pd(ndev->pd);
out_free_dev:
	kfree(ndev);
	return NULL;
}

struct ib_pd *nvs_alloc_discovery_pd(struct ib_device *ibdev)
{
	/* OK: rdma-remote-access-overbroad -- the discovery controller's PD has no global rkey; log pages are read through the capsule */
	return ib_alloc_pd(ibdev, 0);
}

void nvs_free_device(struct nvs_device *ndev)
{
	list_del(&ndev->entry);
	ib_dealloc_pd(ndev->pd);
	kfree(ndev);
}

int nvs_map_sg_inline(struct nvs_device *ndev, struct nvs_request *req,
		      struct nvs_sgl_desc *sg, int count, u32 len)
{
	struct ib_sge *sge = &req->sge[1];
	struct scatterlist *sgl;
	u32 i;

	/* data in the capsule: the controller never sees a key */
	for_each_sg(req->sgl, sgl, count, i) {
		sge->addr = sg_dma_address(sgl);
		sge->length = sg_dma_len(sgl);
		sge->lkey = ndev->pd->local_dma_lkey;
		sge++;
	}

	sg->addr = cpu_to_le64(0);
	put_unaligned_le24(len, sg->length);
	sg->type = 0x01;
	req->num_sge += count;
	return 0;
}

int nvs_map_sg_single(struct nvs_device *ndev, struct nvs_request *req,
		      struct nvs_sgl_desc *sg)
{
	if (register_always)
		return -EAGAIN;	/* caller falls back to fast registration */

	sg->addr = cpu_to_le64(sg_dma_address(req->sgl));
	put_unaligned_le24(sg_dma_len(req->sgl), sg->length);
	put_unaligned_le32(ndev->pd->unsafe_global_rkey, sg->key);
	sg->type = 0x40;
	return 0;
}
