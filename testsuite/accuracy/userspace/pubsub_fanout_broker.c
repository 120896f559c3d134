/*
 * fanout: the delivery engine of a publish/subscribe broker.  Published
 * messages are copied once into the broker's message store; each message
 * is then pushed into every subscriber's receive ring with an RDMA
 * WRITE_WITH_IMM (the immediate carries the ring index).  Each subscriber
 * has its own RC QP with requested-only signaling; the push path is meant
 * to signal one write in FANOUT_SIG_EVERY so the send queue is reclaimed.
 * A separate admin QP takes SUBSCRIBE / UNSUBSCRIBE requests.
 *
 * Correct: the subscriber QPs clamp their depth to max_qp_wr and read the
 * granted inline size back (messages are inlined only up to that size).
 *
 * Not correct: the push path tests sub->since_sig but advances
 * sub->posted instead, so no write is ever signaled and every subscriber's
 * send queue fills after its depth; the admin QP asks for 2048 receive
 * entries without looking at the device's limit.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FANOUT_SQ_DEPTH		4096
#define FANOUT_INLINE		188
#define FANOUT_SIG_EVERY	32
#define FANOUT_SLOT		1024
#define FANOUT_STORE_SLOTS	8192
#define FANOUT_ADMIN_RQ		2048
#define FANOUT_MAX_SUBS		256

struct fanout_sub {
	struct ibv_qp *qp;
	uint64_t       ring_va;
	uint32_t       ring_rkey;
	uint32_t       ring_slots;
	uint32_t       tail;
	uint32_t       inline_max;
	unsigned int   since_sig;	/* writes since the last signaled one */
	uint64_t       posted;		/* statistics */
	int            dead;
};

struct fanout {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *data_cq;
	struct ibv_cq      *admin_cq;
	struct ibv_qp      *admin_qp;
	char               *store;
	struct ibv_mr      *store_mr;	/* source of the pushes */
	uint32_t            store_next;
	struct fanout_sub  *subs[FANOUT_MAX_SUBS];
	unsigned int        nsubs;
};

int fanout_store_init(struct fanout *b)
{
	size_t len = (size_t)FANOUT_STORE_SLOTS * FANOUT_SLOT;

	b->store = aligned_alloc(4096, len);
	if (!b->store)
		return -ENOMEM;
	b->store_mr = ibv_reg_mr(b->pd, b->store, len, 0); // BUG: rdma-local-mr-management -- its lkey is the source of the ULP's RDMA WRITEs
	if (!b->store_mr) {
		free(b->store);
		return -errno;
	}
	return 0;
}

int fanout_admin_open(struct fanout *b)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = b->admin_cq;
	attr.recv_cq = b->admin_cq;
	attr.sq_sig_all = 1;
	attr.cap.max_send_wr = 64;
	attr.cap.max_recv_wr = FANOUT_ADMIN_RQ; // BUG: rdma-queue-cap-unchecked -- 2048 receive entries, never compared with max_qp_wr
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	b->admin_qp = ibv_create_qp(b->pd, &attr);
	return b->admin_qp ? 0 : -errno;
}

int fanout_sub_create_qp(struct fanout *b, struct fanout_sub *sub)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(b->ctx, &da))
		return -EIO;
	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = b->data_cq;
	attr.recv_cq = b->data_cq;
	attr.sq_sig_all = 0;
	/* OK: rdma-queue-cap-unchecked -- clamped to the device's max_qp_wr */
	attr.cap.max_send_wr = FANOUT_SQ_DEPTH > da.max_qp_wr ? da.max_qp_wr : FANOUT_SQ_DEPTH;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = FANOUT_INLINE;
	sub->qp = ibv_create_qp(b->pd, &attr);
	if (!sub->qp)
		return -errno;
	/* OK: rdma-queue-cap-unchecked -- the granted inline size is read back and used */
	sub->inline_max = attr.cap.max_inline_data;
	sub->since_sig = 0;
	sub->posted = 0;
	return 0;
}

static int fanout_push(struct fanout *b, struct fanout_sub *sub, const char *src, uint32_t len)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	sge.addr = (uintptr_t)src;
	sge.length = len;
	sge.lkey = b->store_mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)sub;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htobe32(sub->tail);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = sub->ring_va +
		(uint64_t)(sub->tail % sub->ring_slots) * FANOUT_SLOT;
	wr.wr.rdma.rkey = sub->ring_rkey;
	if (len <= sub->inline_max)
		wr.send_flags |= IBV_SEND_INLINE;
	// BUG: rdma-unsignaled-send-starvation -- since_sig is reset here but never advanced (the post below counts 'posted'), so no write is ever signaled
	if (sub->since_sig >= FANOUT_SIG_EVERY) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		sub->since_sig = 0;
	}
	if (ibv_post_send(sub->qp, &wr, &bad))
		return -EIO;
	sub->posted++;
	sub->tail++;
	return 0;
}

int fanout_publish(struct fanout *b, const void *msg, uint32_t len)
{
	char *slot;
	unsigned int i;
	int ret = 0;

	if (len > FANOUT_SLOT)
		return -EMSGSIZE;
	slot = b->store + (size_t)(b->store_next++ % FANOUT_STORE_SLOTS) * FANOUT_SLOT;
	memcpy(slot, msg, len);
	for (i = 0; i < b->nsubs; i++) {
		struct fanout_sub *sub = b->subs[i];

		if (sub->dead)
			continue;
		if (fanout_push(b, sub, slot, len)) {
			sub->dead = 1;
			ret = -EIO;
		}
	}
	return ret;
}

int fanout_poll(struct fanout *b)
{
	struct ibv_wc wc[32];
	int n, k;

	n = ibv_poll_cq(b->data_cq, 32, wc);
	for (k = 0; k < n; k++)
		if (wc[k].status != IBV_WC_SUCCESS)
			((struct fanout_sub *)(uintptr_t)wc[k].wr_id)->dead = 1;
	return n;
}
