/*
 * chunkfetch: a chunk-replication worker.  A replication request posts a
 * SEND to the source node announcing the transfer, an RDMA READ of the
 * chunk, and a SEND acknowledging completion -- three work requests, all
 * posted at once in one chain (the acknowledgement is fenced behind the
 * READ).  Up to depth requests are in flight.
 *
 * Not correct: the send queue reserves two entries per request.
 * Correct: the factor counts data work requests only (this file posts no
 * registration or invalidation); the READ sink is the worker's chunk
 * buffer, registered with REMOTE_WRITE because iWARP needs it for READ
 * sinks; its key never leaves (it does not need to).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CF_CHUNK	(4u << 20)

struct cf_req {
	uint64_t           chunk_id;
	char              *buf;
	uint64_t           hdr[2];
	uint64_t           ack[2];
	struct ibv_sge     hdr_sge, data_sge, ack_sge;
	struct ibv_send_wr announce, read, ack_wr;
};

struct cf_worker {
	struct ibv_pd  *pd;
	struct ibv_cq  *cq;
	struct ibv_qp  *qp;
	unsigned int    depth;
	char           *bufs;
	struct ibv_mr  *bufs_mr;
	struct ibv_mr  *ctl_mr;
	struct cf_req  *reqs;
};

int cf_worker_init(struct cf_worker *w)
{
	struct ibv_qp_init_attr attr;

	w->bufs = aligned_alloc(4096, (size_t)w->depth * CF_CHUNK);
	if (!w->bufs)
		return -ENOMEM;
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE is what an iWARP READ sink needs */
	w->bufs_mr = ibv_reg_mr(w->pd, w->bufs, (size_t)w->depth * CF_CHUNK, // BUG: rdma-local-mr-management -- the buffers are the sink of the worker's own READs
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!w->bufs_mr) {
		free(w->bufs);
		return -errno;
	}
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = w->cq;
	attr.recv_cq = w->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-manual-factor -- a data-only factor; no registration WRs here */
	// BUG(file): rdma-send-queue-undersized -- each request posts announce SEND + READ + ack SEND, the queue reserves 2
	attr.cap.max_send_wr = 2 * w->depth;
	attr.cap.max_recv_wr = w->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	w->qp = ibv_create_qp(w->pd, &attr);
	if (!w->qp) {
		ibv_dereg_mr(w->bufs_mr);
		free(w->bufs);
		return -errno;
	}
	return 0;
}

int cf_replicate(struct cf_worker *w, struct cf_req *r, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr *bad;

	r->hdr[0] = r->chunk_id;
	r->hdr[1] = 0;
	r->ack[0] = r->chunk_id;
	r->ack[1] = 1;
	r->hdr_sge = (struct ibv_sge){ (uintptr_t)r->hdr, sizeof(r->hdr), w->ctl_mr->lkey };
	r->data_sge = (struct ibv_sge){ (uintptr_t)r->buf, CF_CHUNK, w->bufs_mr->lkey };
	r->ack_sge = (struct ibv_sge){ (uintptr_t)r->ack, sizeof(r->ack), w->ctl_mr->lkey };

	memset(&r->announce, 0, sizeof(r->announce));
	r->announce.opcode = IBV_WR_SEND;
	r->announce.sg_list = &r->hdr_sge;
	r->announce.num_sge = 1;
	r->announce.next = &r->read;

	memset(&r->read, 0, sizeof(r->read));
	r->read.opcode = IBV_WR_RDMA_READ;
	r->read.sg_list = &r->data_sge;
	r->read.num_sge = 1;
	r->read.wr.rdma.remote_addr = raddr;
	r->read.wr.rdma.rkey = rkey;
	r->read.next = &r->ack_wr;

	memset(&r->ack_wr, 0, sizeof(r->ack_wr));
	r->ack_wr.wr_id = (uintptr_t)r;
	r->ack_wr.opcode = IBV_WR_SEND;
	r->ack_wr.sg_list = &r->ack_sge;
	r->ack_wr.num_sge = 1;
	r->ack_wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
	/* OK: rdma-access-flags-transport -- the READ sink carries REMOTE_WRITE */
	return ibv_post_send(w->qp, &r->announce, &bad);
}
