/*
 * tsdb-ingest: the RDMA ingest path of a time-series database.  Queue
 * sizes are compile-time configuration: QD outstanding batches, each
 * posting WR_PER_BATCH work requests (header SEND, payload WRITE, commit
 * SEND), and batch headers are sent inline.
 *
 * Not correct: the derived constants exceed what every device supports --
 * SQ_DEPTH = 512 * 3 = 1536 send WRs and 128 bytes of inline data -- and
 * nothing compares them with the device's limits before ibv_create_qp().
 * Correct: the receive side (QD receives, 1 SGE) and the send SGE count.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <string.h>

#define QD		512
#define WR_PER_BATCH	3
#define SQ_DEPTH	(QD * WR_PER_BATCH)
#define HDR_INLINE	128

struct ingest_conn {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

int ingest_create_qp(struct ingest_conn *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 1;
	attr.cap.max_send_wr = SQ_DEPTH; // BUG: rdma-queue-cap-unchecked -- 1536 send WRs, never compared with max_qp_wr
	attr.cap.max_recv_wr = QD;	/* OK: rdma-queue-cap-unchecked -- 512 is within every device's limit */
	attr.cap.max_send_sge = 2;	/* OK: rdma-queue-cap-unchecked -- 2 SGEs */
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = HDR_INLINE; // BUG: rdma-queue-cap-unchecked -- 128 inline bytes, never compared or read back
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}
