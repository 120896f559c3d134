/*
 * rselftest: a start-up self test that checks the RDMA data path by
 * RDMA-WRITEing a pattern from one buffer to another over a loopback QP
 * connected to itself.  The destination's key is used by the loopback
 * WRITE (the "peer" is this process), so it legitimately needs REMOTE_WRITE.
 *
 * Not correct: the source buffer was registered with the same flags as
 * the destination; the source is only read locally by the WRITE (its
 * lkey), so REMOTE_READ/REMOTE_WRITE on it are unused rights.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ST_LEN	65536
#define ST_ALL	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

struct selftest {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;	/* connected to itself */
	char          *src, *dst;
	struct ibv_mr *src_mr, *dst_mr;
};

int selftest_run(struct selftest *t)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int n, ret = -EIO;

	t->src = malloc(ST_LEN);
	t->dst = calloc(1, ST_LEN);
	if (!t->src || !t->dst)
		goto out_free;
	memset(t->src, 0xa5, ST_LEN);
	// BUG: rdma-remote-access-overbroad -- the source's rkey is never used; only its lkey feeds the WRITE
	t->src_mr = ibv_reg_mr(t->pd, t->src, ST_LEN, ST_ALL); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITE
	if (!t->src_mr)
		goto out_free;
	/* OK: rdma-remote-access-overbroad -- the loopback WRITE targets dst through its rkey */
	t->dst_mr = ibv_reg_mr(t->pd, t->dst, ST_LEN, ST_ALL); // BUG: rdma-local-mr-management -- the rkey is the target of the ULP's own RDMA WRITE
	if (!t->dst_mr)
		goto out_src;

	sge.addr = (uintptr_t)t->src;
	sge.length = ST_LEN;
	sge.lkey = t->src_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = (uintptr_t)t->dst;
	wr.wr.rdma.rkey = t->dst_mr->rkey;
	if (ibv_post_send(t->qp, &wr, &bad))
		goto out_dst;
	do
		n = ibv_poll_cq(t->cq, 1, &wc);
	while (n == 0);
	if (n == 1 && wc.status == IBV_WC_SUCCESS && !memcmp(t->src, t->dst, ST_LEN))
		ret = 0;
out_dst:
	ibv_dereg_mr(t->dst_mr);
out_src:
	/* OK: rdma-mr-leak -- both MRs released on every path */
	ibv_dereg_mr(t->src_mr);
out_free:
	free(t->src);
	free(t->dst);
	return ret;
}
