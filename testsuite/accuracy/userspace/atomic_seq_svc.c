/*
 * seqd: a sequencer service.  A table of 64-bit sequence counters lives in
 * server memory; clients take sequence numbers with RDMA fetch-and-add on
 * the counter they need, without involving the server's CPU.  The table is
 * a process-wide MR (g_seq_mr) created once and announced to every client.
 *
 * Client side (same file, the tool is symmetric): fetch-and-add results
 * land in a small result buffer registered once with LOCAL_WRITE.
 *
 * Not correct: the counter table is registered for remote atomics and
 * remote reads but without local write; ibv_reg_mr() rejects the
 * combination (EINVAL), so the service never starts.
 * Correct: the global MR is kept on success (not a leak); the client's
 * result buffer has the local write the atomic response needs.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_COUNTERS	1024

struct seq_announce {
	uint64_t table;
	uint32_t rkey;
	uint32_t ncounters;
};

static uint64_t *g_seq_table;
static struct ibv_mr *g_seq_mr;

int seqd_init(struct ibv_pd *pd, struct seq_announce *ann)
{
	if (posix_memalign((void **)&g_seq_table, 64, SEQ_COUNTERS * sizeof(uint64_t)))
		return -ENOMEM;
	memset(g_seq_table, 0, SEQ_COUNTERS * sizeof(uint64_t));
	// BUG: rdma-access-flags-invalid -- REMOTE_ATOMIC without IBV_ACCESS_LOCAL_WRITE
	g_seq_mr = ibv_reg_mr(pd, g_seq_table, SEQ_COUNTERS * sizeof(uint64_t), // BUG: rdma-local-mr-management -- rkey announced to clients
			      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ);
	if (!g_seq_mr) {
		free(g_seq_table);
		g_seq_table = NULL;
		return -errno;
	}
	ann->table = htobe64((uintptr_t)g_seq_table);
	ann->rkey = htobe32(g_seq_mr->rkey);
	ann->ncounters = htobe32(SEQ_COUNTERS);
	/* OK: rdma-mr-leak -- the MR stays in the global g_seq_mr until seqd_fini() */
	return 0;
}

void seqd_fini(void)
{
	ibv_dereg_mr(g_seq_mr);
	g_seq_mr = NULL;
	free(g_seq_table);
	g_seq_table = NULL;
}

/* ---- client ---- */

struct seq_client {
	struct ibv_pd  *pd;
	struct ibv_cq  *cq;
	struct ibv_qp  *qp;
	uint64_t       *result;
	struct ibv_mr  *result_mr;
	struct seq_announce srv;
};

int seq_client_init(struct seq_client *c)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	if (posix_memalign((void **)&c->result, 8, sizeof(uint64_t)))
		return -ENOMEM;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE for the atomic response, no remote rights */
	/* OK: rdma-local-mr-management -- result word registered once; atomics are not READ/WRITE data transfer */
	c->result_mr = ibv_reg_mr(c->pd, c->result, sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE);
	if (!c->result_mr)
		goto err_result;
	c->qp = ibv_create_qp(c->pd, &attr);
	if (!c->qp)
		goto err_mr;
	return 0;
err_mr:
	ibv_dereg_mr(c->result_mr);
err_result:
	free(c->result);
	return -EIO;
}

int seq_next(struct seq_client *c, unsigned int counter, uint64_t *out)
{
	struct ibv_sge sge = { (uintptr_t)c->result, sizeof(uint64_t), c->result_mr->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int n;

	if (counter >= be32toh(c->srv.ncounters))
		return -EINVAL;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	/* OK: rdma-unsignaled-send-starvation -- every fetch-add is signaled and waited for */
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.atomic.remote_addr = be64toh(c->srv.table) + counter * sizeof(uint64_t);
	wr.wr.atomic.rkey = be32toh(c->srv.rkey);
	wr.wr.atomic.compare_add = 1;
	if (ibv_post_send(c->qp, &wr, &bad))
		return -EIO;
	do
		n = ibv_poll_cq(c->cq, 1, &wc);
	while (n == 0);
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	*out = *c->result;
	return 0;
}
