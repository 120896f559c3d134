// SPDX-License-Identifier: GPL-2.0
/*
 * kyr marshal: builds the RPC-over-RDMA transport header of a Call,
 * registers the read, write and reply chunks and sends the Call.
 *
 * Chunk segments are encoded as (handle, length, offset); the handle is the
 * rkey the server uses for its RDMA READ or RDMA WRITE.
 */
#include <linux/slab.h>
#include <linux/string.h>
#include "ky_rpcrdma.h"

#define KYR_VERSION	1
#define KYR_MSG		0
#define KYR_NOMSG	1

static __be32 *kyr_encode_segment(__be32 *p, struct kyr_mr *mr)
{
	*p++ = cpu_to_be32(mr->handle);
	*p++ = cpu_to_be32(mr->length);
	*p++ = cpu_to_be32((u32)(mr->offset >> 32));
	*p++ = cpu_to_be32((u32)mr->offset);
	return p;
}

/*
 * Register the payload segments as one chunk of the given type and encode
 * them. Returns the new end of the header or an ERR_PTR.
 */
static __be32 *kyr_register_chunk(struct kyr_xprt *r_xprt,
				  struct kyr_req *req, __be32 *p,
				  enum kyr_chunktype type)
{
	struct kyr_seg *seg = req->rl_segs;
	int nsegs = req->rl_nsegs;
	__be32 *countp = NULL;
	u32 nchunks = 0;

	if (type != kyr_readch)
		countp = p++;

	do {
		struct kyr_seg *next;
		struct kyr_mr *mr;

		if (req->rl_nmrs >= KYR_MAX_SEGS)
			return ERR_PTR(-EMSGSIZE);
		mr = kyr_mr_get(r_xprt);
		if (!mr)
			return ERR_PTR(-EAGAIN);

		next = kyr_frwr_map(r_xprt, seg, nsegs, type, req->rl_xid, mr);
		if (IS_ERR(next)) {
			kyr_mr_put(mr);
			return (__be32 *)next;
		}
		list_add_tail(&mr->mr_list, &req->rl_registered);
		req->rl_nmrs++;

		if (type == kyr_readch) {
			*p++ = cpu_to_be32(1);		/* item present */
			*p++ = cpu_to_be32(0);		/* XDR position */
		}
		p = kyr_encode_segment(p, mr);
		nchunks++;

		nsegs -= next - seg;
		seg = next;
	} while (nsegs);

	if (countp)
		*countp = cpu_to_be32(nchunks);
	return p;
}

int kyr_marshal_req(struct kyr_xprt *r_xprt, struct kyr_req *req)
{
	struct kyr_ep *ep = r_xprt->rx_ep;
	__be32 *p = req->rl_hdrbuf;

	*p++ = cpu_to_be32(req->rl_xid);
	*p++ = cpu_to_be32(KYR_VERSION);
	*p++ = cpu_to_be32(ep->max_requests);
	*p++ = cpu_to_be32(req->rl_rtype == kyr_readch ? KYR_NOMSG : KYR_MSG);

	req->rl_nmrs = 0;
	if (req->rl_rtype == kyr_readch) {
		p = kyr_register_chunk(r_xprt, req, p, kyr_readch);
		if (IS_ERR(p))
			goto out_reset;
	}
	*p++ = 0;				/* end of read list */

	if (req->rl_wtype == kyr_writech) {
		*p++ = cpu_to_be32(1);
		p = kyr_register_chunk(r_xprt, req, p, kyr_writech);
		if (IS_ERR(p))
			goto out_reset;
	}
	*p++ = 0;				/* end of write list */

	if (req->rl_wtype == kyr_replych) {
		*p++ = cpu_to_be32(1);
		p = kyr_register_chunk(r_xprt, req, p, kyr_replych);
		if (IS_ERR(p))
			goto out_reset;
	} else {
		*p++ = 0;			/* no reply chunk */
	}

	req->rl_sge[0].addr = req->rl_hdr_dma;
	req->rl_sge[0].length = (u8 *)p - (u8 *)req->rl_hdrbuf;
	req->rl_sge[0].lkey = ep->pd->local_dma_lkey;
	return 0;

out_reset:
	kyr_frwr_reset(req);
	return PTR_ERR(p);
}

static void kyr_wc_send(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyr_req *req = container_of(wc->wr_cqe, struct kyr_req, rl_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyr: Send of xid %08x failed: %s\n", req->rl_xid,
		       ib_wc_status_msg(wc->status));
}

int kyr_send_call(struct kyr_xprt *r_xprt, struct kyr_req *req)
{
	struct kyr_ep *ep = r_xprt->rx_ep;
	int rc;

	INIT_LIST_HEAD(&req->rl_registered);
	rc = kyr_marshal_req(r_xprt, req);
	if (rc)
		return rc;

	req->rl_cqe.done = kyr_wc_send;
	req->rl_wr.next = NULL;
	req->rl_wr.wr_cqe = &req->rl_cqe;
	req->rl_wr.sg_list = req->rl_sge;
	req->rl_wr.num_sge = 1;
	req->rl_wr.opcode = IB_WR_SEND;
	req->rl_wr.send_flags = 0;

	ib_dma_sync_single_for_device(ep->id->device, req->rl_hdr_dma,
				      KYR_HDR_SIZE, DMA_TO_DEVICE);

	rc = kyr_frwr_send(r_xprt, req);
	if (rc) {
		kyr_frwr_reset(req);
		return -ENOTCONN;
	}
	return 0;
}

/* Called from the Receive completion once the Reply matched this Call. */
void kyr_reply_done(struct kyr_req *req)
{
	struct kyr_xprt *r_xprt = req->rl_xprt;

	if (!list_empty(&req->rl_registered))
		kyr_frwr_unmap_sync(r_xprt, req);
	kyr_complete_rqst(req);
}
