/*
 * ptl_bulk_client.c - client side of an RPC transport with server-driven
 * bulk data movement (ptlrpc style), over extended verbs.
 *
 * An RPC that moves bulk data takes a bulk descriptor: a slot of the
 * client's bulk region and a type-2 memory window.  The window is bound
 * over the slot and the request SEND carries its rkey; both go out in one
 * ibv_wr_start()/ibv_wr_complete() batch.  The server RDMA-WRITEs (read
 * RPCs) or RDMA-READs (write RPCs) the slot and answers with a reply sent
 * as SEND_WITH_INV of the window's rkey.  Write RPCs also get a BULK_DONE
 * notice once the server has pulled the data.  Completions are read with
 * the ibv_cq_ex polling API.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define KRPC_BULK_SLOT      (1U << 20)
#define KRPC_MSG_SIZE       1024
#define KRPC_RX_BUFS        2048
#define KRPC_INLINE_MAX     256
#define KRPC_WR_INV         0x1ULL

#define CERROR(fmt, ...)    fprintf(stderr, "krpc: " fmt, ##__VA_ARGS__)

enum { KRPC_MSG_REPLY = 1, KRPC_MSG_BULK_DONE = 2 };

struct krpc_wire {
	uint32_t             type;
	uint32_t             bulk_rkey;
	uint64_t             bulk_addr;
	uint32_t             bulk_len;
	uint32_t             pad;
	uint64_t             cookie;        /* client request, echoed by the server */
};

struct kbulk_desc {
	struct kbulk_desc   *bd_next;
	struct ibv_mw       *bd_mw;
	uint32_t             bd_rkey;
	char                *bd_buf;
	uint32_t             bd_len;
	unsigned int         bd_access;
	bool                 bd_need_inv;
};

struct krpc_req {
	uint64_t             rq_xid;
	struct kbulk_desc   *rq_bulk;
	void                *rq_msg;        /* slot in the message region */
	unsigned int         rq_rep_flags;
	uint32_t             rq_rep_inv_rkey;
	int                  rq_status;
	void               (*rq_done)(struct krpc_req *req);
};

struct kconn {
	struct ibv_context  *kc_ctx;
	struct ibv_pd       *kc_pd;
	struct ibv_cq_ex    *kc_cq;
	struct ibv_qp       *kc_qp;
	struct ibv_qp_ex    *kc_qpx;
	unsigned int         kc_max_rpcs;
	unsigned int         kc_inline;
	char                *kc_bulk;
	struct ibv_mr       *kc_bulk_mr;
	struct kbulk_desc   *kc_descs;
	struct kbulk_desc   *kc_free_descs;
	char                *kc_msgs;
	struct ibv_mr       *kc_msg_mr;
};

int krpc_post_recv(struct kconn *kc, uint64_t slot);	/* krpc_rx.c */

static void kbulk_put(struct kconn *kc, struct kbulk_desc *bd)
{
	bd->bd_len = 0;
	bd->bd_next = kc->kc_free_descs;
	kc->kc_free_descs = bd;
}

static int kconn_create_qp(struct kconn *kc)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = attr.recv_cq = ibv_cq_ex_to_cq(kc->kc_cq);
	attr.qp_type = IBV_QPT_RC;
	attr.pd = kc->kc_pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-undersized -- BIND_MW, request SEND and LOCAL_INV: three per RPC plus one */
	attr.cap.max_send_wr = 3 * kc->kc_max_rpcs + 1;	// BUG: rdma-send-queue-manual-factor -- hand-made factor 3 for bind, send and invalidate over kc_max_rpcs
	attr.cap.max_recv_wr = KRPC_RX_BUFS;	/* OK: rdma-queue-cap-unchecked -- kconn_setup refuses devices with max_qp_wr below it */
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = KRPC_INLINE_MAX;	// BUG: rdma-queue-cap-unchecked -- 256 bytes of inline data, never compared with what the device grants
	attr.sq_sig_all = 0;	/* OK: rdma-unsignaled-send-starvation -- request SENDs and LOCAL_INVs are signaled */

	kc->kc_qp = ibv_create_qp_ex(kc->kc_ctx, &attr);
	if (!kc->kc_qp)
		return -errno;
	kc->kc_qpx = ibv_qp_to_qp_ex(kc->kc_qp);
	kc->kc_inline = KRPC_INLINE_MAX;
	return 0;
}

static int kbulk_pool_init(struct kconn *kc)
{
	size_t len = (size_t)kc->kc_max_rpcs * KRPC_BULK_SLOT;
	unsigned int i, j;

	kc->kc_bulk = aligned_alloc(4096, len);
	kc->kc_descs = calloc(kc->kc_max_rpcs, sizeof(*kc->kc_descs));
	if (!kc->kc_bulk || !kc->kc_descs)
		goto out_free;
	// BUG: rdma-local-mr-management -- the bulk region is exposed through windows bound per RPC
	kc->kc_bulk_mr = ibv_reg_mr(kc->kc_pd, kc->kc_bulk, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!kc->kc_bulk_mr)
		goto out_free;

	for (i = 0; i < kc->kc_max_rpcs; i++) {
		struct kbulk_desc *bd = &kc->kc_descs[i];

		bd->bd_mw = ibv_alloc_mw(kc->kc_pd, IBV_MW_TYPE_2);	// BUG: rdma-local-mr-management -- one window per descriptor to hand bulk slots to the server
		if (!bd->bd_mw)
			goto out_mw;
		bd->bd_rkey = bd->bd_mw->rkey;
		bd->bd_buf = kc->kc_bulk + (size_t)i * KRPC_BULK_SLOT;
		kbulk_put(kc, bd);
	}
	return 0;

out_mw:
	/* OK: rdma-mr-leak -- the windows allocated so far and the bulk MR are all released */
	for (j = 0; j < i; j++)
		ibv_dealloc_mw(kc->kc_descs[j].bd_mw);
	ibv_dereg_mr(kc->kc_bulk_mr);
out_free:
	free(kc->kc_descs);
	free(kc->kc_bulk);
	return -ENOMEM;
}

int kconn_setup(struct kconn *kc, struct ibv_context *ctx, unsigned int max_rpcs)
{
	struct ibv_cq_init_attr_ex cq_attr = { 0 };
	struct ibv_device_attr dattr;
	size_t msg_len = (size_t)(max_rpcs + KRPC_RX_BUFS) * KRPC_MSG_SIZE;

	if (ibv_query_device(ctx, &dattr))
		return -errno;
	if (dattr.max_qp_wr < KRPC_RX_BUFS)
		return -EOPNOTSUPP;
	kc->kc_ctx = ctx;
	kc->kc_max_rpcs = max_rpcs;
	kc->kc_pd = ibv_alloc_pd(ctx);
	kc->kc_msgs = calloc(1, msg_len);
	if (!kc->kc_pd || !kc->kc_msgs)
		return -ENOMEM;
	/* OK: rdma-local-mr-management -- request and reply buffers, registered once, local access only */
	kc->kc_msg_mr = ibv_reg_mr(kc->kc_pd, kc->kc_msgs, msg_len, IBV_ACCESS_LOCAL_WRITE);
	if (!kc->kc_msg_mr)
		return -errno;

	cq_attr.cqe = 4 * max_rpcs + KRPC_RX_BUFS;
	cq_attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	kc->kc_cq = ibv_create_cq_ex(ctx, &cq_attr);
	if (!kc->kc_cq)
		return -errno;	// BUG: rdma-mr-leak -- kc_msg_mr stays registered when the CQ cannot be created
	if (kconn_create_qp(kc) || kbulk_pool_init(kc)) {
		ibv_dereg_mr(kc->kc_msg_mr);	/* OK: rdma-mr-leak -- released when the QP or the bulk pool cannot be set up */
		return -ENOMEM;
	}
	return 0;
}

/* bind the descriptor's window and send the request in one batch */
int krpc_send_bulk(struct kconn *kc, struct krpc_req *req, struct kbulk_desc *bd,
		   uint32_t len, bool server_writes)
{
	struct ibv_mw_bind_info bi = {
		.mr = kc->kc_bulk_mr,
		.addr = (uintptr_t)bd->bd_buf,
		.length = len,
		.mw_access_flags = server_writes ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ,
	};
	struct krpc_wire *wire = req->rq_msg;

	bd->bd_len = len;
	bd->bd_access = bi.mw_access_flags;
	bd->bd_rkey = ibv_inc_rkey(bd->bd_rkey);
	bd->bd_need_inv = true;
	req->rq_bulk = bd;
	wire->bulk_rkey = bd->bd_rkey;
	wire->bulk_addr = (uintptr_t)bd->bd_buf;
	wire->bulk_len = len;
	wire->cookie = (uintptr_t)req;

	ibv_wr_start(kc->kc_qpx);
	kc->kc_qpx->wr_id = (uintptr_t)bd;
	kc->kc_qpx->wr_flags = 0;
	/* OK: rdma-rkey-reuse, rdma-access-flags-invalid -- fresh key for every RPC; the bulk MR has LOCAL_WRITE and MW_BIND */
	ibv_wr_bind_mw(kc->kc_qpx, bd->bd_mw, bd->bd_rkey, &bi);	// BUG: rdma-local-mr-management -- window bound by hand to expose the bulk slot
	kc->kc_qpx->wr_id = (uintptr_t)req;
	kc->kc_qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(kc->kc_qpx);
	ibv_wr_set_sge(kc->kc_qpx, kc->kc_msg_mr->lkey, (uintptr_t)req->rq_msg, KRPC_MSG_SIZE);
	return ibv_wr_complete(kc->kc_qpx);
}

/* resend after reconnect: the descriptor and its slot are reused as they are */
int krpc_resend_bulk(struct kconn *kc, struct krpc_req *req)
{
	struct kbulk_desc *bd = req->rq_bulk;
	struct ibv_mw_bind_info bi = {
		.mr = kc->kc_bulk_mr, .addr = (uintptr_t)bd->bd_buf,
		.length = bd->bd_len, .mw_access_flags = bd->bd_access,
	};

	ibv_wr_start(kc->kc_qpx);
	kc->kc_qpx->wr_id = (uintptr_t)bd;
	kc->kc_qpx->wr_flags = 0;
	ibv_wr_bind_mw(kc->kc_qpx, bd->bd_mw, bd->bd_rkey, &bi);	// BUG: rdma-rkey-reuse, rdma-local-mr-management -- rebinds under the key of the first attempt, which the old server instance still holds
	kc->kc_qpx->wr_id = (uintptr_t)req;
	kc->kc_qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(kc->kc_qpx);
	ibv_wr_set_sge(kc->kc_qpx, kc->kc_msg_mr->lkey, (uintptr_t)req->rq_msg, KRPC_MSG_SIZE);
	return ibv_wr_complete(kc->kc_qpx);
}

static int kbulk_local_inv(struct kconn *kc, struct kbulk_desc *bd, unsigned int flags)
{
	ibv_wr_start(kc->kc_qpx);
	kc->kc_qpx->wr_id = (uintptr_t)bd | KRPC_WR_INV;
	kc->kc_qpx->wr_flags = flags;
	ibv_wr_local_inv(kc->kc_qpx, bd->bd_rkey);
	return ibv_wr_complete(kc->kc_qpx);
}

/* reply received: the flags and the invalidated rkey were copied into req */
static void krpc_req_finish(struct kconn *kc, struct krpc_req *req)
{
	struct kbulk_desc *bd = req->rq_bulk;

	if (bd) {
		/* OK: rdma-remote-invalidate-unchecked -- the key the server invalidated must be this descriptor's */
		if ((req->rq_rep_flags & IBV_WC_WITH_INV) && req->rq_rep_inv_rkey == bd->bd_rkey) {
			bd->bd_need_inv = false;
			kbulk_put(kc, bd);	/* OK: rdma-invalidation-leak -- the window was invalidated by the matching SEND_WITH_INV */
		} else if (kbulk_local_inv(kc, bd, IBV_SEND_SIGNALED)) {
			req->rq_status = -EIO;	/* descriptor stays out of the pool */
		}
		req->rq_bulk = NULL;
	}
	req->rq_done(req);
}

static void krpc_bulk_done(struct kconn *kc, struct ibv_cq_ex *cq, struct krpc_req *req)
{
	struct kbulk_desc *bd = req->rq_bulk;

	if (!bd)
		return;
	if (ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_INV) {	// BUG: rdma-remote-invalidate-unchecked -- takes any invalidation as the end of this descriptor's window
		bd->bd_need_inv = false;
		kbulk_put(kc, bd);
		req->rq_bulk = NULL;
	}
}

/* the server is gone: give up on the RPC */
void krpc_expire(struct kconn *kc, struct krpc_req *req)
{
	struct kbulk_desc *bd = req->rq_bulk;

	req->rq_status = -ETIMEDOUT;
	if (bd) {
		kbulk_put(kc, bd);	// BUG: rdma-invalidation-leak -- the window is still bound for the server when the descriptor is recycled
		req->rq_bulk = NULL;
	}
	req->rq_done(req);
}

/* connection lost: invalidate every window that is still out and recycle */
void krpc_abort_all(struct kconn *kc, struct krpc_req **inflight, unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		struct kbulk_desc *bd = inflight[i]->rq_bulk;

		if (!bd || !bd->bd_need_inv)
			continue;
		if (kbulk_local_inv(kc, bd, 0))
			continue;
		kbulk_put(kc, bd);	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is unsignaled and not yet executed when the slot is recycled
		inflight[i]->rq_bulk = NULL;
	}
}

void krpc_poll(struct kconn *kc)
{
	struct ibv_poll_cq_attr attr = { 0 };
	int ret;

	ret = ibv_start_poll(kc->kc_cq, &attr);
	if (ret)
		return;		/* ENOENT: nothing to reap, no end_poll */
	while (ret == 0) {
		struct ibv_cq_ex *cq = kc->kc_cq;

		if (cq->status != IBV_WC_SUCCESS) {
			CERROR("completion error %s\n", ibv_wc_status_str(cq->status));
		} else if (ibv_wc_read_opcode(cq) == IBV_WC_LOCAL_INV) {
			/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- recycled from the LOCAL_INV's own completion */
			kbulk_put(kc, (struct kbulk_desc *)(uintptr_t)(cq->wr_id & ~KRPC_WR_INV));
		} else if (ibv_wc_read_opcode(cq) & IBV_WC_RECV) {
			struct krpc_wire *msg = (struct krpc_wire *)(kc->kc_msgs + cq->wr_id * KRPC_MSG_SIZE);
			struct krpc_req *req = (struct krpc_req *)(uintptr_t)msg->cookie;

			if (msg->type == KRPC_MSG_BULK_DONE) {
				krpc_bulk_done(kc, cq, req);
			} else {
				req->rq_rep_flags = ibv_wc_read_wc_flags(cq);
				/* OK: rdma-remote-invalidate-unchecked -- only records the invalidated rkey; krpc_req_finish compares it */
				if (req->rq_rep_flags & IBV_WC_WITH_INV)
					req->rq_rep_inv_rkey = ibv_wc_read_invalidated_rkey(cq);
				krpc_req_finish(kc, req);
			}
			krpc_post_recv(kc, cq->wr_id);
		}
		ret = ibv_next_poll(cq);
	}
	if (ret != ENOENT)
		CERROR("poll failed: %d\n", ret);
	ibv_end_poll(kc->kc_cq);
}
