/*
 * smbd_io.c: queue pair and the RDMA read/write request path.
 *
 * The send queue holds the SEND credits plus a BIND_MW and a LOCAL_INV for
 * each of the max_mrs windows (correct, but a hand-made factor for the
 * registration work requests: migration note).  A reply carrying
 * SEND_WITH_INV retires the window only when smbd_check_remote_inv()
 * agrees; otherwise smbd_deregister_mr() invalidates locally.
 *
 * Not correct: when the request SEND cannot be posted after the window was
 * bound, the window is put back on the free list as is; the bind (posted
 * before, and executed) left its key valid over the caller's buffer.
 */
#include "smbd.h"

#include <errno.h>
#include <string.h>

struct smbd_rw_req {
	uint64_t offset;
	uint32_t length;
	uint32_t key;
	uint64_t addr;
};

int smbd_create_qp(struct smbd_conn *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- SEND credits plus BIND + LOCAL_INV per window */
	attr.cap.max_send_wr = c->send_credits + 2 * c->max_mrs + 1; // BUG: rdma-send-queue-manual-factor -- max_mrs times a hand-made factor for BIND/LOCAL_INV
	attr.cap.max_recv_wr = c->send_credits;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

struct smbd_mr *smbd_send_rw_request(struct smbd_conn *c, void *buf, uint32_t len,
				     bool server_writes, uint64_t offset,
				     struct smbd_rw_req *pkt)
{
	struct smbd_mr *mr = smbd_register_mr(c, buf, len, server_writes);
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (!mr)
		return NULL;
	pkt->offset = offset;
	pkt->length = len;
	pkt->key = mr->key;
	pkt->addr = (uintptr_t)buf;
	sge.addr = (uintptr_t)pkt;
	sge.length = sizeof(*pkt);
	sge.lkey = c->pkt_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)mr;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(c->qp, &wr, &bad)) {
		// BUG: rdma-invalidation-leak -- the window was bound (its key valid over buf) and goes back to the free list without LOCAL_INV
		smbd_put_mr(c, mr);
		return NULL;
	}
	return mr;
}

int smbd_rw_done(struct smbd_conn *c, struct smbd_mr *mr, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- smbd_check_remote_inv() compares the invalidated key */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && smbd_check_remote_inv(mr, wc->invalidated_rkey)) {
		mr->bound = false;
		smbd_put_mr(c, mr);
		return 0;
	}
	return smbd_deregister_mr(c, mr);
}
