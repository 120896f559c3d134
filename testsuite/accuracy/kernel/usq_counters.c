// SPDX-License-Identifier: GPL-2.0
/*
 * tlm: three channel types of an invented telemetry fan-out service
 * ("tlm"), each with its own QP created with IB_SIGNAL_REQ_WR and its own
 * rule for when to ask for a completion.
 *
 *   - metric channels signal when atomic_read(&mc->unsignaled) reaches the
 *     batch size, but the counter is only ever atomic_set() to zero: never
 *     signaled (bug);
 *   - trace channels signal when fewer than TLM_LOW_WATER send entries are
 *     free, but tc->sq_free is set once at creation and never decremented:
 *     with a queue deeper than the low-water mark, never signaled (bug; the
 *     counter is "stored non-zero" only at init);
 *   - alert channels signal when "alerts_since_signal" reaches 8, but the
 *     code increments a different field (alerts_sent): never signaled (bug);
 *   - log channels signal every 16th SEND using a counter they advance on
 *     each post (right).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <rdma/ib_verbs.h>

#define TLM_BATCH	32
#define TLM_LOW_WATER	8

struct tlm_qp_base {
	struct ib_pd	*pd;
	struct ib_cq	*cq;
	struct ib_qp	*qp;
	u32		depth;
};

struct tlm_metric_chan {
	struct tlm_qp_base	b;
	atomic_t		unsignaled;
};

struct tlm_trace_chan {
	struct tlm_qp_base	b;
	u32			sq_free;
};

struct tlm_alert_chan {
	struct tlm_qp_base	b;
	u32			alerts_since_signal;
	u32			alerts_sent;
};

struct tlm_log_chan {
	struct tlm_qp_base	b;
	u32			posted;
};

static int tlm_create_qp(struct tlm_qp_base *b)
{
	struct ib_qp_init_attr attr = { };

	attr.send_cq = b->cq;
	attr.recv_cq = b->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.cap.max_send_wr = b->depth;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	b->qp = ib_create_qp(b->pd, &attr);
	if (IS_ERR(b->qp))
		return PTR_ERR(b->qp);
	return 0;
}

static void tlm_build(struct tlm_qp_base *b, struct ib_send_wr *wr,
		      struct ib_sge *sge, u64 dma, u32 len)
{
	sge->addr = dma;
	sge->length = len;
	sge->lkey = b->pd->local_dma_lkey;
	memset(wr, 0, sizeof(*wr));
	wr->opcode = IB_WR_SEND;
	wr->sg_list = sge;
	wr->num_sge = 1;
}

int tlm_metric_open(struct tlm_metric_chan *mc)
{
	atomic_set(&mc->unsignaled, 0);
	return tlm_create_qp(&mc->b);
}

int tlm_metric_send(struct tlm_metric_chan *mc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(&mc->b, &wr, &sge, dma, len);
	/* BUG: rdma-unsignaled-send-starvation -- mc->unsignaled is only ever reset, so the batch size is never reached */
	if (atomic_read(&mc->unsignaled) >= TLM_BATCH) {
		wr.send_flags = IB_SEND_SIGNALED;
		atomic_set(&mc->unsignaled, 0);
	}
	return ib_post_send(mc->b.qp, &wr, NULL);
}

int tlm_trace_open(struct tlm_trace_chan *tc)
{
	tc->sq_free = tc->b.depth;
	return tlm_create_qp(&tc->b);
}

int tlm_trace_send(struct tlm_trace_chan *tc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(&tc->b, &wr, &sge, dma, len);
	/* BUG: rdma-unsignaled-send-starvation -- sq_free never goes down from the queue depth, so the low-water branch never runs */
	if (tc->sq_free < TLM_LOW_WATER)
		wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(tc->b.qp, &wr, NULL);
}

int tlm_alert_send(struct tlm_alert_chan *ac, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(&ac->b, &wr, &sge, dma, len);
	ac->alerts_sent++;
	/* BUG: rdma-unsignaled-send-starvation -- alerts_since_signal is never advanced (alerts_sent is), so no alert is ever signaled */
	if (ac->alerts_since_signal == 8) {
		wr.send_flags = IB_SEND_SIGNALED;
		ac->alerts_since_signal = 0;
	}
	return ib_post_send(ac->b.qp, &wr, NULL);
}

int tlm_log_send(struct tlm_log_chan *lc, u64 dma, u32 len)
{
	struct ib_send_wr wr;
	struct ib_sge sge;

	tlm_build(&lc->b, &wr, &sge, dma, len);
	/* OK: rdma-unsignaled-send-starvation -- the counter is advanced on every post */
	if (++lc->posted % 16 == 0)
		wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(lc->b.qp, &wr, NULL);
}
