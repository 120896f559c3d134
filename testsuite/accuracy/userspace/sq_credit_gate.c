/*
 * pushq: pushes records to a consumer: an RDMA WRITE of the record into
 * the consumer's ring followed by a SEND with the record's index.  The
 * send queue has `depth` + 1 entries, and a record costs two -- but posts
 * are gated by send-queue credits counted in work requests, not in
 * records: pushq_push() refuses (EAGAIN) unless two entries are free, and
 * the SEND's completion gives back both (it retires the unsignaled WRITE
 * in front of it).  So the queue cannot overflow; at most depth/2 records
 * are in flight, which is the designed window.
 *
 * Correct for every check here; the near-miss is the sizing, which looks
 * like one entry per record.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#define PUSHQ_WRS_PER_REC	2

struct pushq {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	unsigned int   depth;
	unsigned int   sq_free;	/* free send-queue entries */
	uint32_t       rec_lkey;
	uint64_t       ring_addr;
	uint32_t       ring_rkey;
	uint32_t       rec_size;
	uint64_t       idx;
};

int pushq_create(struct pushq *q)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- posts are gated by WR credits (sq_free), so the queue never holds more than it has */
	attr.cap.max_send_wr = q->depth + 1;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(uint64_t);
	q->qp = ibv_create_qp(q->pd, &attr);
	if (!q->qp)
		return -errno;
	q->sq_free = q->depth + 1;
	return 0;
}

int pushq_push(struct pushq *q, const void *rec)
{
	struct ibv_sge sge = { (uintptr_t)rec, q->rec_size, q->rec_lkey };
	struct ibv_sge isge = { (uintptr_t)&q->idx, sizeof(q->idx), 0 };
	struct ibv_send_wr write, send, *bad;

	if (q->sq_free < PUSHQ_WRS_PER_REC)
		return -EAGAIN;
	memset(&write, 0, sizeof(write));
	write.opcode = IBV_WR_RDMA_WRITE;
	write.sg_list = &sge;
	write.num_sge = 1;
	write.wr.rdma.remote_addr = q->ring_addr + (q->idx % (q->depth / PUSHQ_WRS_PER_REC)) * q->rec_size;
	write.wr.rdma.rkey = q->ring_rkey;
	write.next = &send;
	memset(&send, 0, sizeof(send));
	send.wr_id = PUSHQ_WRS_PER_REC;
	send.opcode = IBV_WR_SEND;
	send.sg_list = &isge;
	send.num_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- every record's SEND is signaled */
	send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	if (ibv_post_send(q->qp, &write, &bad))
		return -EIO;
	q->sq_free -= PUSHQ_WRS_PER_REC;
	q->idx++;
	return 0;
}

int pushq_reap(struct pushq *q)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(q->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		q->sq_free += (unsigned int)wc[i].wr_id;
	}
	return n;
}
