/*
 * tstream: pushes a telemetry stream into a collector's ring with
 * rdma_post_write() on an rdma_cm connection (rdma_create_id /
 * rdma_resolve_addr / rdma_create_qp).  The producer never waits for
 * individual writes -- the collector acknowledges progress by updating a
 * credit word the producer reads from its own memory (the collector
 * RDMA-WRITEs it).
 *
 * Not correct: the QP signals requested work requests only (sq_sig_all =
 * 0) and rdma_post_write() is always called with flags 0; no work request
 * ever generates a send completion, so the send-queue entries of completed
 * writes are never reclaimed and the producer stalls for good after
 * max_send_wr writes, whatever the credits say.
 * Correct: the credit word is exposed with LOCAL_WRITE | REMOTE_WRITE and
 * its key is sent in the connect private data.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TS_DEPTH	256
#define TS_REC		64

struct ts_conn_data {
	uint64_t credit_addr;
	uint32_t credit_rkey;
	uint32_t pad;
};

struct tstream {
	struct rdma_event_channel *ch;
	struct rdma_cm_id         *id;
	struct ibv_pd             *pd;
	struct ibv_cq             *cq;
	char                      *recs;
	struct ibv_mr             *recs_mr;
	volatile uint64_t         *credit;
	struct ibv_mr             *credit_mr;
	uint64_t                   ring_addr;
	uint32_t                   ring_rkey;
	uint64_t                   produced;
};

int tstream_setup_qp(struct tstream *t)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = t->cq;
	attr.recv_cq = t->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = TS_DEPTH;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	// BUG(file): rdma-unsignaled-send-starvation -- requested-only signaling and every rdma_post_write() passes flags 0
	attr.sq_sig_all = 0;
	if (rdma_create_qp(t->id, t->pd, &attr))
		return -errno;
	return 0;
}

int tstream_setup_mem(struct tstream *t, struct ts_conn_data *cd)
{
	t->recs = calloc(TS_DEPTH, TS_REC);
	t->credit = calloc(1, sizeof(uint64_t));
	if (!t->recs || !t->credit)
		return -ENOMEM;
	t->recs_mr = rdma_reg_msgs(t->id, t->recs, TS_DEPTH * TS_REC); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITEs
	if (!t->recs_mr)
		return -errno;
	/* OK: rdma-access-flags-invalid -- rdma_reg_write() includes LOCAL_WRITE */
	t->credit_mr = rdma_reg_write(t->id, (void *)t->credit, sizeof(uint64_t)); // BUG: rdma-local-mr-management -- rkey handed to the collector
	if (!t->credit_mr) {
		rdma_dereg_mr(t->recs_mr);
		return -errno;
	}
	cd->credit_addr = (uintptr_t)t->credit;
	cd->credit_rkey = t->credit_mr->rkey;
	return 0;
}

int tstream_push(struct tstream *t, const void *rec)
{
	unsigned int slot = t->produced % TS_DEPTH;
	char *src = t->recs + (size_t)slot * TS_REC;

	if (t->produced - *t->credit >= TS_DEPTH)
		return -EAGAIN;
	memcpy(src, rec, TS_REC);
	if (rdma_post_write(t->id, NULL, src, TS_REC, t->recs_mr, 0,
			    t->ring_addr + (uint64_t)slot * TS_REC, t->ring_rkey))
		return -errno;
	t->produced++;
	return 0;
}
