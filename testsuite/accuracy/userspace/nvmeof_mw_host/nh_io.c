/*
 * nh_io.c: I/O submission, completion and timeouts of the nh host.
 *
 * Correct: the remote invalidation is verified by nh_mw_check_inv() (which
 * compares keys) before a request completes without a LOCAL_INV; otherwise
 * a signaled LOCAL_INV is posted and the request is freed from its
 * completion.
 * Not correct: the timeout path posts an unsignaled LOCAL_INV and frees the
 * request (its buffer goes back to the upper layer) immediately, before the
 * invalidation executed.
 */
#include "nh.h"

#include <endian.h>
#include <errno.h>
#include <string.h>
#include <time.h>

static uint64_t nh_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void nh_req_free(struct nh_qpair *q, struct nh_req *r)
{
	r->busy = false;
	r->next_free = q->free_reqs;
	q->free_reqs = r;
}

int nh_submit(struct nh_qpair *q, struct nh_req *r, uint8_t opc, uint64_t slba)
{
	struct ibv_send_wr *bad;
	bool h2c = opc == 0x01;

	nh_mw_prep_bind(q, r, h2c);
	r->bind_wr.next = &r->cmd_wr;
	r->cmd.cid = htole16(r->cid);
	r->cmd.opc = opc;
	r->cmd.slba = htole64(slba);
	r->cmd.addr = htole64((uintptr_t)r->data);
	r->cmd.key = htole32(r->key);
	r->cmd.len = htole32(r->len);
	r->cmd_sge.addr = (uintptr_t)&r->cmd;
	r->cmd_sge.length = sizeof(r->cmd);
	r->cmd_sge.lkey = q->cmd_mr->lkey;
	memset(&r->cmd_wr, 0, sizeof(r->cmd_wr));
	r->cmd_wr.wr_id = (uintptr_t)r;
	r->cmd_wr.opcode = IBV_WR_SEND;
	r->cmd_wr.sg_list = &r->cmd_sge;
	r->cmd_wr.num_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- the command SEND is signaled and retires the bind */
	r->cmd_wr.send_flags = IBV_SEND_SIGNALED;
	r->busy = true;
	r->deadline_ms = nh_now_ms() + 30000;
	return ibv_post_send(q->qp, &r->bind_wr, &bad) ? -EIO : 0;
}

void nh_process_rsp(struct nh_qpair *q, const struct ibv_wc *wc, uint16_t cid, int status)
{
	struct nh_req *r;

	if (cid >= q->depth || !q->reqs[cid].busy)
		return;
	r = &q->reqs[cid];
	/* OK: rdma-remote-invalidate-unchecked -- the key is handed to nh_mw_check_inv(), which compares */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && nh_mw_check_inv(r, wc->invalidated_rkey)) {
		r->cb(r, status);
		nh_req_free(q, r);
		return;
	}
	if (nh_mw_local_inv(q, r, IBV_SEND_SIGNALED))
		r->cb(r, -EIO);		/* stays busy: reclaimed at teardown */
}

void nh_inv_done(struct nh_qpair *q, const struct ibv_wc *wc)
{
	struct nh_req *r = (struct nh_req *)(uintptr_t)(wc->wr_id & ~1ull);

	if (wc->status != IBV_WC_SUCCESS)
		return;
	r->cb(r, 0);
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- freed from the LOCAL_INV completion */
	nh_req_free(q, r);
}

void nh_check_timeouts(struct nh_qpair *q)
{
	uint64_t now = nh_now_ms();
	unsigned int i;

	for (i = 0; i < q->depth; i++) {
		struct nh_req *r = &q->reqs[i];

		if (!r->busy || r->deadline_ms > now)
			continue;
		nh_mw_local_inv(q, r, 0);
		r->cb(r, -ETIMEDOUT);
		// BUG: rdma-unmap-before-invalidate -- the request (and its buffer) is released right after an unsignaled LOCAL_INV
		nh_req_free(q, r);
	}
}
