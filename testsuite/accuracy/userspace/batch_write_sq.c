/*
 * replog: replicates log appends to a follower.  An append is scattered
 * into up to REPLOG_SEGS remote log segments (the follower's log is a ring
 * of fixed segments) with one RDMA WRITE each, followed by a SEND that
 * carries the new tail.  The WRITEs are posted in a loop, linked through
 * their next pointers, and the SEND closes the chain.
 *
 * The send queue was sized "two per append" (WRITE + SEND) before appends
 * could span segments; an append that spans three segments posts four
 * work requests, so with `depth` appends in flight the queue overflows.
 * The factor only counts data work requests -- this file posts no
 * registration or invalidation -- so it is not the manual-factor pattern.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#define REPLOG_SEGS	3
#define REPLOG_SEG_SIZE	(1u << 20)

struct replog_append {
	struct ibv_sge     sge[REPLOG_SEGS];
	struct ibv_send_wr write[REPLOG_SEGS];
	struct ibv_sge     tail_sge;
	struct ibv_send_wr tail;
	uint64_t           new_tail;
};

struct replog {
	struct ibv_pd        *pd;
	struct ibv_cq        *cq;
	struct ibv_qp        *qp;
	struct ibv_mr        *log_mr;	/* local log, registered by the log layer */
	struct ibv_mr        *ctl_mr;
	unsigned int          depth;
	uint64_t              remote_base;
	uint32_t              remote_rkey;
	struct replog_append *appends;
};

int replog_create_qp(struct replog *r)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = r->cq;
	attr.recv_cq = r->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-manual-factor -- a data-only factor; no REG/INV work requests here */
	// BUG(file): rdma-send-queue-undersized -- an append posts up to 3 WRITEs + 1 SEND, the queue reserves 2
	attr.cap.max_send_wr = 2 * r->depth;
	attr.cap.max_recv_wr = r->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	r->qp = ibv_create_qp(r->pd, &attr);
	return r->qp ? 0 : -errno;
}

int replog_post_append(struct replog *r, unsigned int slot, const char *data, uint64_t off,
		       uint32_t len)
{
	struct replog_append *a = &r->appends[slot % r->depth];
	struct ibv_send_wr **tail = NULL, *head = NULL, *bad;
	uint32_t done = 0;
	int i = 0;

	tail = &head;
	while (done < len && i < REPLOG_SEGS) {
		uint64_t seg_off = (off + done) % REPLOG_SEG_SIZE;
		uint32_t n = REPLOG_SEG_SIZE - seg_off;

		if (n > len - done)
			n = len - done;
		a->sge[i].addr = (uintptr_t)(data + done);
		a->sge[i].length = n;
		a->sge[i].lkey = r->log_mr->lkey;
		memset(&a->write[i], 0, sizeof(a->write[i]));
		a->write[i].opcode = IBV_WR_RDMA_WRITE;
		a->write[i].sg_list = &a->sge[i];
		a->write[i].num_sge = 1;
		a->write[i].wr.rdma.remote_addr = r->remote_base + (off + done) % (REPLOG_SEGS * REPLOG_SEG_SIZE);
		a->write[i].wr.rdma.rkey = r->remote_rkey;
		*tail = &a->write[i];
		tail = &a->write[i].next;
		done += n;
		i++;
	}
	if (done < len)
		return -E2BIG;

	a->new_tail = off + len;
	a->tail_sge.addr = (uintptr_t)&a->new_tail;
	a->tail_sge.length = sizeof(a->new_tail);
	a->tail_sge.lkey = r->ctl_mr->lkey;
	memset(&a->tail, 0, sizeof(a->tail));
	a->tail.wr_id = slot;
	a->tail.opcode = IBV_WR_SEND;
	a->tail.sg_list = &a->tail_sge;
	a->tail.num_sge = 1;
	a->tail.send_flags = IBV_SEND_SIGNALED;
	*tail = &a->tail;
	return ibv_post_send(r->qp, head, &bad);
}
