// RUN: %check_ulplint --kernel %s rdma-unmap-before-invalidate %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-unmap-before-invalidate %t.plugin

// An iSER-like initiator: a task has a registration per direction, and its
// release helper walks the task's own directions, unmapping each and
// returning its descriptor to the pool. The response path posts the
// task's LOCAL_INVs unsignaled and releases at once: the finding belongs
// at that call, where the ordering is wrong, not inside the helper that
// only walks the parts it was handed. The signaled path waits for the
// invalidation before it releases.

#include <rdma/ib_verbs.h>
#include <linux/completion.h>
#include <linux/dma-mapping.h>
#include <linux/mm.h>

#define TK_DIRS 2

struct tk_desc {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr;
	struct ib_cqe cqe;
};

struct tk_reg {
	struct tk_desc *desc;
	u32 rkey;
};

struct tk_conn {
	struct ib_device *ibdev;
	struct ib_qp *qp;
};

struct tk_task {
	struct tk_conn *conn;
	struct scatterlist *sg[TK_DIRS];
	int nents[TK_DIRS];
	bool dir[TK_DIRS];
	struct tk_reg reg[TK_DIRS];
	struct completion inv_done;
};

void tk_desc_put(struct tk_conn *conn, struct tk_desc *desc);
struct tk_desc *tk_desc_get(struct tk_conn *conn);

/* Registers a direction's pages for the target to RDMA READ or WRITE. */
int tk_map(struct tk_task *task, int d)
{
	struct tk_desc *desc = tk_desc_get(task->conn);
	int n;

	if (!desc)
		return -EAGAIN;
	n = ib_map_mr_sg(desc->mr, task->sg[d], task->nents[d], NULL, PAGE_SIZE);
	if (n != task->nents[d]) {
		tk_desc_put(task->conn, desc);
		return -EINVAL;
	}
	ib_update_fast_reg_key(desc->mr, ib_inc_rkey(desc->mr->rkey));
	desc->reg_wr.wr.opcode = IB_WR_REG_MR;
	desc->reg_wr.wr.send_flags = 0;
	desc->reg_wr.wr.next = NULL;
	desc->reg_wr.mr = desc->mr;
	desc->reg_wr.key = desc->mr->rkey;
	desc->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			      IB_ACCESS_REMOTE_WRITE;
	task->reg[d].desc = desc;
	task->reg[d].rkey = desc->mr->rkey;
	return ib_post_send(task->conn->qp, &desc->reg_wr.wr, NULL);
}

static void tk_task_release(struct tk_task *task)
{
	struct tk_conn *conn = task->conn;
	int d;

	for (d = 0; d < TK_DIRS; d++) {
		struct tk_desc *desc = task->reg[d].desc;

		if (!task->dir[d])
			continue;
		ib_dma_unmap_sg(conn->ibdev, task->sg[d], task->nents[d],
				d ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
		if (desc) {
			task->reg[d].desc = NULL;
			tk_desc_put(conn, desc);
		}
		task->dir[d] = false;
	}
}

static int tk_post_inv(struct tk_task *task, int d, bool signaled)
{
	struct tk_desc *desc = task->reg[d].desc;

	desc->inv_wr.opcode = IB_WR_LOCAL_INV;
	desc->inv_wr.ex.invalidate_rkey = desc->mr->rkey;
	desc->inv_wr.send_flags = signaled ? IB_SEND_SIGNALED : 0;
	desc->inv_wr.wr_cqe = &desc->cqe;
	desc->inv_wr.next = NULL;
	return ib_post_send(task->conn->qp, &desc->inv_wr, NULL);
}

void tk_response(struct tk_task *task)
{
	int d;

	for (d = 0; d < TK_DIRS; d++)
		if (task->dir[d] && task->reg[d].desc)
			tk_post_inv(task, d, false);
	tk_task_release(task);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'tk_task_release' runs right after posting a LOCAL_INV{{.*}}[rdma-unmap-before-invalidate]
}

void tk_abort(struct tk_task *task)
{
	int d;

	for (d = 0; d < TK_DIRS; d++)
		if (task->dir[d] && task->reg[d].desc)
			tk_post_inv(task, d, true);
	wait_for_completion(&task->inv_done);
	tk_task_release(task);
}
