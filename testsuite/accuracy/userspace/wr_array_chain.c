/*
 * kvput: the PUT path of a key-value client with server-side logging.  A
 * PUT posts, in one chain built from a wr[] array, an RDMA WRITE of the
 * value into the server's value heap, an RDMA WRITE of the 16-byte log
 * record into the server's log, and the commit SEND.  Up to `window` PUTs
 * are in flight.
 *
 * Not correct: max_send_wr = window + 1, sized for "one SEND per PUT"
 * before the one-sided writes were added; every PUT now posts three work
 * requests.  (The array holds three distinct WRs per PUT, each occupying
 * its own send-queue entry.)
 * Correct: the SEND that closes the chain is signaled and retires the
 * unsignaled WRITEs; the value and log buffers need no remote rights.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

enum { KP_WR_VALUE, KP_WR_LOG, KP_WR_COMMIT, KP_NR_WR };

struct kp_put {
	struct ibv_sge     sge[KP_NR_WR];
	struct ibv_send_wr wr[KP_NR_WR];
	uint64_t           log_rec[2];
	uint64_t           commit[2];
};

struct kp_client {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *val_mr, *ctl_mr;
	unsigned int   window;
	uint64_t       heap_addr, log_addr;
	uint32_t       heap_rkey, log_rkey;
	struct kp_put *puts;
};

int kp_create_qp(struct kp_client *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	// BUG(file): rdma-send-queue-undersized -- each PUT posts 3 WRs (value WRITE, log WRITE, commit SEND), the queue reserves 1
	attr.cap.max_send_wr = c->window + 1;
	attr.cap.max_recv_wr = c->window;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

int kp_put(struct kp_client *c, unsigned int slot, const void *val, uint32_t len,
	   uint64_t heap_off, uint64_t log_off, uint64_t key)
{
	struct kp_put *p = &c->puts[slot % c->window];
	struct ibv_send_wr *bad;
	int i;

	p->log_rec[0] = key;
	p->log_rec[1] = heap_off;
	p->commit[0] = key;
	p->commit[1] = len;

	p->sge[KP_WR_VALUE] = (struct ibv_sge){ (uintptr_t)val, len, c->val_mr->lkey };
	p->sge[KP_WR_LOG] = (struct ibv_sge){ (uintptr_t)p->log_rec, sizeof(p->log_rec), c->ctl_mr->lkey };
	p->sge[KP_WR_COMMIT] = (struct ibv_sge){ (uintptr_t)p->commit, sizeof(p->commit), c->ctl_mr->lkey };

	for (i = 0; i < KP_NR_WR; i++) {
		memset(&p->wr[i], 0, sizeof(p->wr[i]));
		p->wr[i].sg_list = &p->sge[i];
		p->wr[i].num_sge = 1;
		p->wr[i].next = i + 1 < KP_NR_WR ? &p->wr[i + 1] : NULL;
	}
	p->wr[KP_WR_VALUE].opcode = IBV_WR_RDMA_WRITE;
	p->wr[KP_WR_VALUE].wr.rdma.remote_addr = c->heap_addr + heap_off;
	p->wr[KP_WR_VALUE].wr.rdma.rkey = c->heap_rkey;
	p->wr[KP_WR_LOG].opcode = IBV_WR_RDMA_WRITE;
	p->wr[KP_WR_LOG].wr.rdma.remote_addr = c->log_addr + log_off;
	p->wr[KP_WR_LOG].wr.rdma.rkey = c->log_rkey;
	p->wr[KP_WR_COMMIT].opcode = IBV_WR_SEND;
	p->wr[KP_WR_COMMIT].wr_id = slot;
	p->wr[KP_WR_COMMIT].send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &p->wr[0], &bad);
}
