/*
 * nvmc: an NVMe-oF-like initiator on windows, polling an extended CQ.  To
 * save a lookup, the completion code compares the invalidated key with
 * the key of the *most recently submitted* command (q->last_key) instead
 * of the key of the command the response belongs to.  With more than one
 * command in flight the comparison is meaningless: a response whose
 * target invalidated the newest command's window retires an older command
 * whose window is still bound (and the newest one later fails its own
 * check and gets a redundant LOCAL_INV).
 *
 * Also not correct: the send queue has depth + 32 entries of slack, but
 * every command posts BIND_MW + SEND and may need a LOCAL_INV.
 * Correct: key rotation; the slack is not a multiplied factor.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct nvmc_cmd {
	uint16_t           cid;
	struct ibv_mw     *mw;
	uint32_t           key;
	int                live;
	struct ibv_send_wr bind, send, inv;
	struct ibv_sge     sge;
	uint8_t            sqe[64];
};

struct nvmc_q {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq_ex   *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *data_mr, *sqe_mr;
	unsigned int        depth;
	uint32_t            last_key;
	struct nvmc_cmd    *cmds;
};

int nvmc_create_qp(struct nvmc_q *q)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ibv_cq_ex_to_cq(q->cq);
	attr.recv_cq = ibv_cq_ex_to_cq(q->cq);
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-manual-factor -- additive slack, no multiplied factor */
	// BUG(file): rdma-send-queue-undersized -- BIND_MW + SEND (+ LOCAL_INV) per command, about one entry per command reserved
	attr.cap.max_send_wr = q->depth + 32;
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(q->pd, &attr);
	return q->qp ? 0 : -errno;
}

int nvmc_submit(struct nvmc_q *q, struct nvmc_cmd *c, void *buf, uint32_t len, int write)
{
	struct ibv_send_wr *bad;

	c->key = ibv_inc_rkey(c->key);
	memset(&c->bind, 0, sizeof(c->bind));
	c->bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-command window bind done by the ULP
	c->bind.bind_mw.mw = c->mw;
	c->bind.bind_mw.rkey = c->key; /* OK: rdma-rkey-reuse -- rotated above */
	c->bind.bind_mw.bind_info.mr = q->data_mr;
	c->bind.bind_mw.bind_info.addr = (uintptr_t)buf;
	c->bind.bind_mw.bind_info.length = len;
	c->bind.bind_mw.bind_info.mw_access_flags = write ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	c->bind.next = &c->send;
	c->sge = (struct ibv_sge){ (uintptr_t)c->sqe, sizeof(c->sqe), q->sqe_mr->lkey };
	memset(&c->send, 0, sizeof(c->send));
	c->send.wr_id = (uintptr_t)c;
	c->send.opcode = IBV_WR_SEND;
	c->send.sg_list = &c->sge;
	c->send.num_sge = 1;
	c->send.send_flags = IBV_SEND_SIGNALED;
	c->live = 1;
	q->last_key = c->key;
	return ibv_post_send(q->qp, &c->bind, &bad) ? -EIO : 0;
}

static void nvmc_local_inv(struct nvmc_q *q, struct nvmc_cmd *c)
{
	struct ibv_send_wr *bad;

	memset(&c->inv, 0, sizeof(c->inv));
	c->inv.wr_id = (uintptr_t)c | 1;
	c->inv.opcode = IBV_WR_LOCAL_INV;
	c->inv.invalidate_rkey = c->key;
	c->inv.send_flags = IBV_SEND_SIGNALED;
	ibv_post_send(q->qp, &c->inv, &bad);
}

void nvmc_poll(struct nvmc_q *q, const uint16_t *rx_cid)
{
	struct ibv_poll_cq_attr pa = { 0 };
	struct nvmc_cmd *c;

	if (ibv_start_poll(q->cq, &pa))
		return;
	do {
		if (q->cq->status != IBV_WC_SUCCESS || ibv_wc_read_opcode(q->cq) != IBV_WC_RECV)
			continue;
		c = &q->cmds[le16toh(rx_cid[q->cq->wr_id]) % q->depth];
		// BUG: rdma-remote-invalidate-unchecked -- compared with the newest command's key (q->last_key), not with c->key
		if ((ibv_wc_read_wc_flags(q->cq) & IBV_WC_WITH_INV) &&
		    ibv_wc_read_invalidated_rkey(q->cq) == q->last_key) {
			c->live = 0;
			continue;
		}
		nvmc_local_inv(q, c);
	} while (ibv_next_poll(q->cq) == 0);
	ibv_end_poll(q->cq);
}
