/*
 * stripe: a bulk data mover that stripes one transfer over several RC QPs
 * ("lanes") to the same peer to use more of the NIC's processing units.
 * Each lane has its own staging buffer (STRIPE_SIG chunk slots, the source
 * of that lane's RDMA WRITEs), registered when the lane is set up, and its own send queue.
 *
 * Correct: lanes signal every STRIPE_SIG-th WRITE with a per-lane counter
 * the post path advances; lanes set up before a failure are unwound
 * (forward loop).
 * Not correct: when the QP of lane i cannot be created, the unwind
 * releases lanes 0..i-1 but not the MR lane i already registered; and
 * every lane asks for 2048 send WRs (the constant every caller passes)
 * without comparing with max_qp_wr.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STRIPE_QPS	4
#define STRIPE_SQ_DEPTH	2048
#define STRIPE_SIG	32
#define STRIPE_CHUNK	(256 * 1024)

struct stripe_lane {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char          *staging;
	unsigned int   since_sig;
	unsigned int   outstanding;
};

struct stripe {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct stripe_lane  lane[STRIPE_QPS];
	uint64_t            remote_addr;
	uint32_t            remote_rkey;
};

static struct ibv_qp *stripe_create_qp(struct stripe *s, struct stripe_lane *l,
				       unsigned int depth)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = l->cq;
	attr.recv_cq = l->cq;
	attr.qp_type = IBV_QPT_RC;
	// BUG(file): rdma-queue-cap-unchecked -- every caller passes STRIPE_SQ_DEPTH (2048); max_qp_wr is never read
	attr.cap.max_send_wr = depth;
	attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	return ibv_create_qp(s->pd, &attr);
}

int stripe_setup(struct stripe *s)
{
	int i, j;

	for (i = 0; i < STRIPE_QPS; i++) {
		struct stripe_lane *l = &s->lane[i];

		l->cq = ibv_create_cq(s->ctx, STRIPE_SQ_DEPTH, NULL, NULL, 0);
		if (!l->cq)
			goto unwind;
		l->staging = aligned_alloc(4096, (size_t)STRIPE_SIG * STRIPE_CHUNK);
		if (!l->staging) {
			ibv_destroy_cq(l->cq);
			goto unwind;
		}
		l->mr = ibv_reg_mr(s->pd, l->staging, (size_t)STRIPE_SIG * STRIPE_CHUNK, 0); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITEs
		if (!l->mr) {
			free(l->staging);
			ibv_destroy_cq(l->cq);
			goto unwind;
		}
		l->qp = stripe_create_qp(s, l, STRIPE_SQ_DEPTH);
		if (!l->qp) {
			free(l->staging);
			ibv_destroy_cq(l->cq);
			goto unwind; // BUG: rdma-mr-leak -- lane i's MR is not deregistered; the unwind only covers lanes before i
		}
	}
	return 0;

unwind:
	/* OK: rdma-mr-leak -- lanes completed before the failure are released */
	for (j = 0; j < i; j++) {
		ibv_destroy_qp(s->lane[j].qp);
		ibv_dereg_mr(s->lane[j].mr);
		free(s->lane[j].staging);
		ibv_destroy_cq(s->lane[j].cq);
	}
	return -ENOMEM;
}

static int stripe_reap(struct stripe_lane *l)
{
	struct ibv_wc wc[8];
	int n, k;

	n = ibv_poll_cq(l->cq, 8, wc);
	for (k = 0; k < n; k++) {
		if (wc[k].status != IBV_WC_SUCCESS)
			return -EIO;
		l->outstanding -= (unsigned int)wc[k].wr_id;
	}
	return n < 0 ? -EIO : 0;
}

int stripe_write(struct stripe *s, const char *src, size_t len, uint64_t off)
{
	size_t done = 0;
	int lane = 0;

	while (done < len) {
		struct stripe_lane *l = &s->lane[lane];
		size_t n = len - done < STRIPE_CHUNK ? len - done : STRIPE_CHUNK;
		char *slot = l->staging + (size_t)l->since_sig * STRIPE_CHUNK;
		struct ibv_sge sge = { (uintptr_t)slot, (uint32_t)n, l->mr->lkey };
		struct ibv_send_wr wr, *bad;

		/* a new batch reuses the slots: the previous batch (ended by a signaled WRITE) must be done */
		if (l->since_sig == 0)
			while (l->outstanding)
				if (stripe_reap(l))
					return -EIO;
		memcpy(slot, src + done, n);

		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.rdma.remote_addr = s->remote_addr + off + done;
		wr.wr.rdma.rkey = s->remote_rkey;
		l->outstanding++;
		/* OK: rdma-unsignaled-send-starvation -- since_sig is advanced on every post */
		if (++l->since_sig == STRIPE_SIG || done + n == len) {
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr_id = l->since_sig;
			l->since_sig = 0;
		}
		if (ibv_post_send(l->qp, &wr, &bad))
			return -EIO;
		done += n;
		lane = (lane + 1) % STRIPE_QPS;
	}
	return 0;
}
