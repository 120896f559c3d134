/*
 * perf_lat.c: context setup and the SEND/RECV ping-pong of the latency
 * benchmark.
 *
 * Not correct (both come from perf_main.c's defaults, which this file
 * trusts):
 *  - the QP asks for user->inline_size (512 by default) bytes of inline
 *    data, neither compared with the device nor read back;
 *  - the QP signals requested work requests only, and every SEND uses
 *    user->send_flags, which is IBV_SEND_INLINE alone by default: no send
 *    completion is ever generated and the send queue fills after tx_depth
 *    iterations.
 * Correct: the buffer's key is exchanged (the peer may RDMA-WRITE it in
 * the write-latency variant); every failure path releases the MR.
 */
#include "perf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int perf_lat_run(struct ibv_context *ctx, const struct perf_user *user,
		 struct perf_peer *me, const struct perf_peer *peer)
{
	struct ibv_qp_init_attr attr;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct ibv_send_wr swr, *sbad;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_wc wc;
	char *buf;
	uint32_t i;
	int ret = -EIO;

	(void)peer;
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		return -errno;
	buf = calloc(2, user->size);
	if (!buf)
		goto out_pd;
	/* OK: rdma-remote-access-overbroad -- the key is exchanged with the peer (me->rkey) */
	mr = ibv_reg_mr(pd, buf, 2 * user->size, // BUG: rdma-local-mr-management -- rkey handed to the peer
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		goto out_buf;
	cq = ibv_create_cq(ctx, 2 * user->tx_depth, NULL, NULL, 0);
	if (!cq)
		goto out_mr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = user->tx_depth;
	attr.cap.max_recv_wr = user->tx_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	// BUG(program): rdma-queue-cap-unchecked -- 512 inline bytes by default (perf_main.c), never compared or read back
	attr.cap.max_inline_data = user->inline_size;
	// BUG(program): rdma-unsignaled-send-starvation -- requested-only signaling, and the SENDs use IBV_SEND_INLINE alone by default
	attr.sq_sig_all = 0;
	qp = ibv_create_qp(pd, &attr);
	if (!qp)
		goto out_cq;
	me->addr = (uintptr_t)buf;
	me->rkey = mr->rkey;
	me->qpn = qp->qp_num;

	for (i = 0; i < user->iters; i++) {
		sge.addr = (uintptr_t)(buf + user->size);
		sge.length = user->size;
		sge.lkey = mr->lkey;
		memset(&rwr, 0, sizeof(rwr));
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		if (ibv_post_recv(qp, &rwr, &rbad))
			goto out_qp;

		sge.addr = (uintptr_t)buf;
		memset(&swr, 0, sizeof(swr));
		swr.opcode = IBV_WR_SEND;
		swr.sg_list = &sge;
		swr.num_sge = 1;
		swr.send_flags = user->send_flags;
		if (ibv_post_send(qp, &swr, &sbad))
			goto out_qp;
		do
			ret = ibv_poll_cq(cq, 1, &wc);
		while (ret == 0);
		if (ret < 0 || wc.status != IBV_WC_SUCCESS) {
			ret = -EIO;
			goto out_qp;
		}
	}
	ret = 0;
out_qp:
	ibv_destroy_qp(qp);
out_cq:
	ibv_destroy_cq(cq);
out_mr:
	/* OK: rdma-mr-leak -- released on every path */
	ibv_dereg_mr(mr);
out_buf:
	free(buf);
out_pd:
	ibv_dealloc_pd(pd);
	return ret;
}
