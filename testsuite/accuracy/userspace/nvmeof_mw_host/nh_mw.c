/*
 * nh_mw.c: memory-window helpers of the nh host: allocation of one window
 * per request slot (unwound on failure), bind preparation with a fresh key
 * per bind, the remote-invalidation check and the LOCAL_INV post.
 */
#include "nh.h"

#include <errno.h>
#include <string.h>

int nh_mw_alloc_all(struct nh_qpair *q)
{
	unsigned int n;

	for (n = 0; n < q->depth; n++) {
		struct nh_req *r = &q->reqs[n];

		if (!(r->mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2))) // BUG: rdma-local-mr-management -- windows allocated by the ULP to expose I/O buffers
			goto undo;
		r->key = r->mw->rkey;
		r->cid = n;
		r->next_free = q->free_reqs;
		q->free_reqs = r;
	}
	return 0;
undo:
	/* OK: rdma-mr-leak -- every window allocated before the failure is released */
	while (n--)
		ibv_dealloc_mw(q->reqs[n].mw);
	q->free_reqs = NULL;
	return -ENOMEM;
}

void nh_mw_free_all(struct nh_qpair *q)
{
	unsigned int n;

	for (n = 0; n < q->depth; n++)
		ibv_dealloc_mw(q->reqs[n].mw);
}

void nh_mw_prep_bind(struct nh_qpair *q, struct nh_req *r, bool host_to_ctrl)
{
	/* OK: rdma-rkey-reuse -- the key is rotated for every bind */
	r->key = ibv_inc_rkey(r->key);
	memset(&r->bind_wr, 0, sizeof(r->bind_wr));
	r->bind_wr.wr_id = (uintptr_t)r;
	r->bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the ULP binds a window per I/O
	r->bind_wr.bind_mw.mw = r->mw;
	r->bind_wr.bind_mw.rkey = r->key;
	r->bind_wr.bind_mw.bind_info.mr = q->data_mr;
	r->bind_wr.bind_mw.bind_info.addr = (uintptr_t)r->data;
	r->bind_wr.bind_mw.bind_info.length = r->len;
	/* OK: rdma-access-flags-invalid -- data_mr has LOCAL_WRITE and MW_BIND */
	r->bind_wr.bind_mw.bind_info.mw_access_flags =
		host_to_ctrl ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
}

bool nh_mw_check_inv(const struct nh_req *r, uint32_t invalidated_rkey)
{
	return invalidated_rkey == r->key;
}

int nh_mw_local_inv(struct nh_qpair *q, struct nh_req *r, unsigned int send_flags)
{
	struct ibv_send_wr *bad;

	memset(&r->inv_wr, 0, sizeof(r->inv_wr));
	r->inv_wr.wr_id = (uintptr_t)r | 1;
	r->inv_wr.opcode = IBV_WR_LOCAL_INV;
	r->inv_wr.invalidate_rkey = r->key;
	r->inv_wr.send_flags = send_flags;
	return ibv_post_send(q->qp, &r->inv_wr, &bad);
}
