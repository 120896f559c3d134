// RUN: %check_ulplint --kernel %s rdma-registration-in-datapath %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-registration-in-datapath %t.plugin

// A target queue that exposes a controller memory buffer: set up once, it
// posts its own REG_MR and waits for it, so the function posts work
// requests like the data path does. Its MR lives in a struct made here and
// hung on the queue (which holds the QP): one per queue, not per I/O. A
// per-command temporary pushed onto a list of the queue is per I/O.

#include <linux/completion.h>
#include <linux/err.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

#define CMB_PAGES 16

struct cmb {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct completion done;
};

struct tmp_reg {
	struct tmp_reg *next;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
};

struct tq {
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct cmb *cmb;
	struct tmp_reg *tmp;
};

/* Near miss: once per queue. */
int tq_cmb_init(struct tq *q)
{
	struct cmb *cmb;
	int ret;

	cmb = kzalloc(sizeof(*cmb), GFP_KERNEL);
	if (!cmb)
		return -ENOMEM;
	cmb->mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, CMB_PAGES);
	if (IS_ERR(cmb->mr)) {
		ret = PTR_ERR(cmb->mr);
		kfree(cmb);
		return ret;
	}
	init_completion(&cmb->done);
	cmb->reg_wr.wr.opcode = IB_WR_REG_MR;
	cmb->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmb->reg_wr.mr = cmb->mr;
	cmb->reg_wr.key = cmb->mr->rkey;
	cmb->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	ret = ib_post_send(q->qp, &cmb->reg_wr.wr, NULL);
	if (ret) {
		ib_dereg_mr(cmb->mr);
		kfree(cmb);
		return ret;
	}
	wait_for_completion(&cmb->done);
	q->cmb = cmb;
	return 0;
}

/* Per command: a temporary registration pushed on the queue's list. */
int tq_map_oversized(struct tq *q)
{
	struct tmp_reg *t;

	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return -ENOMEM;
	t->mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, CMB_PAGES);
	// CHECK-MESSAGES: :[[@LINE-1]]:10: warning: 'ib_alloc_mr' runs once per I/O: 'tq_map_oversized' posts work requests (ib_post_send)
	if (IS_ERR(t->mr)) {
		kfree(t);
		return -ENOMEM;
	}
	t->reg_wr.wr.opcode = IB_WR_REG_MR;
	t->reg_wr.mr = t->mr;
	t->next = q->tmp;
	q->tmp = t;
	return ib_post_send(q->qp, &t->reg_wr.wr, NULL);
	// CHECK-MESSAGES: :[[@LINE-1]]:9: note: 'tq_map_oversized' posts work requests (ib_post_send) here
}
