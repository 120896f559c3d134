/*
 * blobput: a client library call that uploads a caller-provided blob to a
 * storage node: register the blob, send a PUT with (addr, rkey, len), wait
 * until the node has RDMA-READ it and acknowledged, deregister.  Simple and
 * correct as far as keys go (deregistration kills the key right after the
 * ack), but every call registers and deregisters: for small blobs the
 * registration dominates the latency.  Callers reuse the same few buffers,
 * so a registration cache (or a pre-registered bounce pool for small blobs)
 * is the fix.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct blobput_msg {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
	uint64_t blob_id;
};

struct blobput_conn {
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct blobput_msg *msg;
	struct ibv_mr      *msg_mr;
};

static int blobput_wait_ack(struct blobput_conn *c)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS)
			return -EIO;
		if (wc.opcode == IBV_WC_RECV)
			return 0;
	}
}

int blobput(struct blobput_conn *c, uint64_t blob_id, void *blob, uint32_t len)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_mr *mr;
	int ret;

	/* OK: rdma-remote-access-overbroad -- the key goes to the storage node in the PUT */
	mr = ibv_reg_mr(c->pd, blob, len, IBV_ACCESS_REMOTE_READ); // BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the blob is registered on every call
	if (!mr)
		return -errno;
	c->msg->addr = htobe64((uintptr_t)blob);
	c->msg->rkey = htobe32(mr->rkey);
	c->msg->len = htobe32(len);
	c->msg->blob_id = htobe64(blob_id);

	sge.addr = (uintptr_t)c->msg;
	sge.length = sizeof(*c->msg);
	sge.lkey = c->msg_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ret = ibv_post_send(c->qp, &wr, &bad);
	if (!ret)
		ret = blobput_wait_ack(c);
	/* OK: rdma-invalidation-leak, rdma-mr-leak -- deregistration on every path kills the key */
	ibv_dereg_mr(mr); // BUG: rdma-registration-in-datapath -- deregistration on every call
	return ret;
}
