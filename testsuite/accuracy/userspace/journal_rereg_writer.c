/*
 * jrnl: the primary side of a journal-replication link.  An append copies
 * nothing: the caller's record buffer is RDMA-WRITten straight into the
 * replica's journal ring, followed by a SEND that commits the new tail.
 * Up to depth appends are in flight, each on an append slot.  Each slot
 * owns one MR, registered at setup over a placeholder page; to avoid a
 * full registration per append, the append re-points the slot's MR at
 * the caller's record with ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION).
 * The replica acknowledges durable appends with SENDs into the ack ring;
 * for crash recovery it may RDMA-READ the primary's commit-point page, whose
 * key goes out in the hello message.
 *
 * Correct: the send queue holds WRITE + SEND per slot plus one (a factor
 * for data work requests only: this link posts no registration work
 * requests); the commit-point page's key is sent to the replica.
 *
 * Not correct: ibv_rereg_mr() per append is still a registration (kernel
 * call, page pinning, translation update) in the submit path; the ack ring
 * is registered with REMOTE_WRITE although acks arrive as SENDs and its
 * key is never given to anyone (a leftover from the first protocol
 * version, where the replica wrote acks directly).
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JRNL_ACK_SLOTS	64

struct jrnl_commit {
	uint64_t seq;
	uint64_t tail;
};

struct jrnl_hello {
	uint64_t cp_va;
	uint32_t cp_rkey;
	uint32_t depth;
};

struct jrnl_ack {
	uint64_t seq;
};

struct jrnl_slot {
	bool               busy;
	struct ibv_mr     *mr;		/* re-pointed at each append's record */
	struct jrnl_commit commit;
};

struct jrnl {
	struct ibv_pd     *pd;
	struct ibv_cq     *cq;
	struct ibv_qp     *qp;
	unsigned int       depth;
	struct jrnl_slot  *slots;
	struct ibv_mr     *ctl_mr;	/* covers slots[] (commit records) and hello */
	struct jrnl_hello  hello;
	struct jrnl_ack   *acks;
	struct ibv_mr     *ack_mr;
	uint64_t          *cp;		/* commit point page */
	struct ibv_mr     *cp_mr;
	char               placeholder[4096] __attribute__((aligned(4096)));
	uint64_t           ring_va;
	uint32_t           ring_rkey;
	uint64_t           ring_len;
	uint64_t           tail;
	uint64_t           seq;
};

int jrnl_create_qp(struct jrnl *j)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = j->cq;
	attr.recv_cq = j->cq;
	attr.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- WRITE + commit SEND per slot, plus the hello */
	attr.cap.max_send_wr = 2 * j->depth + 1; // OK: rdma-send-queue-manual-factor -- the factor covers data WRs only; nothing here posts REG/INV/BIND
	attr.cap.max_recv_wr = JRNL_ACK_SLOTS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct jrnl_hello);
	j->qp = ibv_create_qp(j->pd, &attr);
	return j->qp ? 0 : -errno;
}

int jrnl_setup_mem(struct jrnl *j)
{
	unsigned int i;

	j->slots = calloc(j->depth, sizeof(*j->slots));
	j->acks = calloc(JRNL_ACK_SLOTS, sizeof(*j->acks));
	j->cp = aligned_alloc(4096, 4096);
	if (!j->slots || !j->acks || !j->cp)
		goto err_free;

	j->ctl_mr = ibv_reg_mr(j->pd, j->slots, j->depth * sizeof(*j->slots), 0);
	if (!j->ctl_mr)
		goto err_free;
	j->ack_mr = ibv_reg_mr(j->pd, j->acks, JRNL_ACK_SLOTS * sizeof(*j->acks),
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-remote-access-overbroad -- acks arrive as SENDs; the ring's rkey is never sent, REMOTE_WRITE only helps an attacker
	if (!j->ack_mr)
		goto err_ctl;
	/* OK: rdma-remote-access-overbroad -- the commit-point key goes to the replica in the hello */
	j->cp_mr = ibv_reg_mr(j->pd, j->cp, 4096, IBV_ACCESS_REMOTE_READ); // BUG: rdma-local-mr-management -- its rkey is handed to the replica
	if (!j->cp_mr)
		goto err_ack;

	for (i = 0; i < j->depth; i++) {
		j->slots[i].mr = ibv_reg_mr(j->pd, j->placeholder, sizeof(j->placeholder), 0); // BUG: rdma-local-mr-management -- its lkey is the source of the ULP's RDMA WRITE
		if (!j->slots[i].mr)
			goto err_slots;
	}
	return 0;

err_slots:
	while (i--)
		ibv_dereg_mr(j->slots[i].mr);
	ibv_dereg_mr(j->cp_mr);
err_ack:
	ibv_dereg_mr(j->ack_mr);
err_ctl:
	ibv_dereg_mr(j->ctl_mr);
err_free:
	free(j->slots);
	free(j->acks);
	free(j->cp);
	return -ENOMEM;
}

int jrnl_send_hello(struct jrnl *j)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	j->hello.cp_va = htobe64((uintptr_t)j->cp);
	j->hello.cp_rkey = htobe32(j->cp_mr->rkey);
	j->hello.depth = htobe32(j->depth);
	sge.addr = (uintptr_t)&j->hello;
	sge.length = sizeof(j->hello);
	sge.lkey = 0;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	wr.wr_id = UINT64_MAX;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_send(j->qp, &wr, &bad);
}

static int jrnl_post_ack(struct jrnl *j, unsigned int i)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;

	sge.addr = (uintptr_t)&j->acks[i];
	sge.length = sizeof(j->acks[i]);
	sge.lkey = j->ack_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = i;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(j->qp, &wr, &bad);
}

int jrnl_post_acks(struct jrnl *j)
{
	unsigned int i;

	for (i = 0; i < JRNL_ACK_SLOTS; i++)
		if (jrnl_post_ack(j, i))
			return -EIO;
	return 0;
}

int jrnl_append(struct jrnl *j, void *rec, uint32_t len)
{
	struct ibv_send_wr write, commit, *bad;
	struct ibv_sge wsge, csge;
	struct jrnl_slot *s = NULL;
	unsigned int i;

	if (len > j->ring_len)
		return -EINVAL;
	for (i = 0; i < j->depth; i++)
		if (!j->slots[i].busy) {
			s = &j->slots[i];
			break;
		}
	if (!s)
		return -EAGAIN;

	/* BUG: rdma-registration-in-datapath -- every append re-registers the slot's MR over the caller's record */
	if (ibv_rereg_mr(s->mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, rec, len, 0))
		return -EIO;
	s->busy = true;

	wsge.addr = (uintptr_t)rec;
	wsge.length = len;
	wsge.lkey = s->mr->lkey;
	memset(&write, 0, sizeof(write));
	write.wr_id = i;
	write.opcode = IBV_WR_RDMA_WRITE;
	write.sg_list = &wsge;
	write.num_sge = 1;
	write.wr.rdma.remote_addr = j->ring_va + j->tail % j->ring_len;
	write.wr.rdma.rkey = j->ring_rkey;
	write.next = &commit;

	s->commit.seq = htobe64(++j->seq);
	s->commit.tail = htobe64(j->tail + len);
	csge.addr = (uintptr_t)&s->commit;
	csge.length = sizeof(s->commit);
	csge.lkey = j->ctl_mr->lkey;
	memset(&commit, 0, sizeof(commit));
	commit.wr_id = i;
	commit.opcode = IBV_WR_SEND;
	commit.send_flags = IBV_SEND_SIGNALED;
	commit.sg_list = &csge;
	commit.num_sge = 1;

	if (ibv_post_send(j->qp, &write, &bad)) {
		s->busy = false;
		return -EIO;
	}
	j->tail += len;
	return 0;
}

int jrnl_poll(struct jrnl *j, void (*durable)(uint64_t seq))
{
	struct ibv_wc wc[16];
	int n, k;

	n = ibv_poll_cq(j->cq, 16, wc);
	for (k = 0; k < n; k++) {
		if (wc[k].status != IBV_WC_SUCCESS)
			return -EIO;
		if (wc[k].opcode == IBV_WC_RECV) {
			unsigned int a = wc[k].wr_id % JRNL_ACK_SLOTS;

			durable(be64toh(j->acks[a].seq));
			jrnl_post_ack(j, a);
			continue;
		}
		if (wc[k].wr_id < j->depth)
			j->slots[wc[k].wr_id].busy = false;
	}
	return n;
}
