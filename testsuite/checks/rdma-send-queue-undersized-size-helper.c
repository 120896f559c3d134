// RUN: %check_ulplint --check-suffixes=SMALL %s rdma-send-queue-undersized %t.small -- -- -DBK_WRS_PER_REQ=2
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.ok -- -- -DBK_WRS_PER_REQ=3

// A block initiator sizes its send queue in a helper, bk_sq_size(q), from
// the WRs it reserves per request. Each request binds a window and sends
// the capsule; a response without remote invalidation adds a LOCAL_INV:
// three WRs. Reserving two (SMALL) overflows the queue at full depth;
// reserving three does not.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

struct bk_req {
	struct ibv_mw *mw;
	void *buf;
	uint32_t len;
	uint32_t rkey;
	uint32_t capsule[16];
};

struct bk_qpair {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *data_mr;
	uint32_t depth;
	struct bk_req *reqs;
};

static uint32_t bk_sq_size(const struct bk_qpair *q)
{
	return BK_WRS_PER_REQ * q->depth + 1;
}

int bk_qpair_create(struct bk_qpair *q)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = bk_sq_size(q);
	// CHECK-MESSAGES-SMALL: :[[@LINE-1]]:2: warning: each request posts up to 3 WRs {{.*}} [rdma-send-queue-undersized]
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(q->pd, &attr);
	return q->qp ? 0 : -1;
}

int bk_submit(struct bk_qpair *q, struct bk_req *r)
{
	struct ibv_send_wr bind = {}, send = {}, *bad;
	struct ibv_sge sge = {
		.addr = (uintptr_t)r->capsule, .length = sizeof(r->capsule),
	};

	r->rkey = ibv_inc_rkey(r->rkey);
	bind.opcode = IBV_WR_BIND_MW;
	bind.bind_mw.mw = r->mw;
	bind.bind_mw.rkey = r->rkey;
	bind.bind_mw.bind_info.mr = q->data_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)r->buf;
	bind.bind_mw.bind_info.length = r->len;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	bind.next = &send;
	r->capsule[0] = r->rkey;
	send.opcode = IBV_WR_SEND;
	send.sg_list = &sge;
	send.num_sge = 1;
	send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	return ibv_post_send(q->qp, &bind, &bad);
}

/* A response that did not invalidate remotely. */
int bk_local_inv(struct bk_qpair *q, struct bk_req *r)
{
	struct ibv_send_wr wr = {}, *bad;

	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = r->rkey;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(q->qp, &wr, &bad);
}
