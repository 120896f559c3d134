// SPDX-License-Identifier: GPL-2.0
/*
 * dsx_conn.c - connection setup and teardown of the DSX storage client.
 *
 * DSX is a request/response object storage protocol: a command SEND names
 * the client buffer by (addr, rkey, length) and the server moves the data
 * with RDMA READ or WRITE before it SENDs the response.  This file creates
 * the connection's PD, CQ, QP and fast-registration MR pool (dsx_io.c
 * registers, dsx_recv.c handles responses), and runs the command timeout
 * scan.  A timed-out command completes only once its key is invalidated.
 */
#include <linux/string.h>
#include <linux/jiffies.h>
#include "dsx.h"

static int dsx_create_qp(struct dsx_conn *conn)
{
	struct ib_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	/* BUG(program): rdma-send-queue-undersized -- one entry per command, but each command chains a REG_MR in front of its SEND and may need a LOCAL_INV */
	attr.cap.max_send_wr = conn->depth + 1;
	/* OK: rdma-queue-cap-unchecked -- dsx_conn_setup() compared the depth with attrs.max_qp_wr before calling here */
	attr.cap.max_recv_wr = DSX_RECV_DEPTH;
	/* BUG(file): rdma-queue-cap-unchecked -- six send SGEs without a look at attrs.max_send_sge */
	attr.cap.max_send_sge = DSX_MAX_SGE;
	attr.cap.max_recv_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- every command SEND and LOCAL_INV is signaled */
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	return rdma_create_qp(conn->cm_id, conn->pd, &attr);
}

static void dsx_timeout_work(struct work_struct *work)
{
	struct dsx_conn *conn =
		container_of(to_delayed_work(work), struct dsx_conn, timeout_work);
	struct dsx_req *req, *tmp;
	LIST_HEAD(expired);

	spin_lock(&conn->lock);
	list_for_each_entry_safe(req, tmp, &conn->inflight, entry)
		if ((long)(jiffies - req->deadline) > 0)
			list_move_tail(&req->entry, &expired);
	spin_unlock(&conn->lock);

	list_for_each_entry_safe(req, tmp, &expired, entry) {
		list_del_init(&req->entry);
		if (!req->mr) {
			dsx_req_complete(req, -ETIMEDOUT);
			continue;
		}
		req->status = -ETIMEDOUT;
		/* OK: rdma-invalidation-leak -- the command completes from its LOCAL_INV completion, once the key is dead */
		if (dsx_io_invalidate(req))
			pr_err("dsx: cannot invalidate rkey %#x of a timed-out command\n",
			       req->mr->rkey);
	}
	queue_delayed_work(system_wq, &conn->timeout_work,
			   msecs_to_jiffies(DSX_TIMEOUT_MS));
}

int dsx_conn_setup(struct dsx_conn *conn)
{
	struct ib_device *dev = conn->dev;
	int ret;

	if (dev->attrs.max_qp_wr < DSX_RECV_DEPTH) {
		pr_err("dsx: %s allows %d work requests per queue\n",
		       dev->name, dev->attrs.max_qp_wr);
		return -EINVAL;
	}
	conn->max_pages = min_t(u32, DSX_MAX_PAGES,
				dev->attrs.max_fast_reg_page_list_len);

	conn->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(conn->pd))
		return PTR_ERR(conn->pd);
	conn->cq = ib_alloc_cq(dev, conn, 3 * conn->depth + DSX_RECV_DEPTH, 0,
			       IB_POLL_WORKQUEUE);
	if (IS_ERR(conn->cq)) {
		ret = PTR_ERR(conn->cq);
		goto out_pd;
	}
	ret = dsx_create_qp(conn);
	if (ret)
		goto out_cq;
	conn->qp = conn->cm_id->qp;

	/* BUG: rdma-local-mr-management -- the client keeps its own MR pool */
	ret = ib_mr_pool_init(conn->qp, &conn->qp->rdma_mrs, conn->depth,
			      IB_MR_TYPE_MEM_REG, conn->max_pages, 0);
	if (ret)
		goto out_qp;

	spin_lock_init(&conn->lock);
	INIT_LIST_HEAD(&conn->inflight);
	INIT_DELAYED_WORK(&conn->timeout_work, dsx_timeout_work);
	queue_delayed_work(system_wq, &conn->timeout_work,
			   msecs_to_jiffies(DSX_TIMEOUT_MS));
	return 0;

out_qp:
	rdma_destroy_qp(conn->cm_id);
out_cq:
	ib_free_cq(conn->cq);
out_pd:
	ib_dealloc_pd(conn->pd);
	return ret;
}

void dsx_conn_teardown(struct dsx_conn *conn)
{
	cancel_delayed_work_sync(&conn->timeout_work);
	rdma_disconnect(conn->cm_id);
	ib_drain_qp(conn->qp);
	ib_mr_pool_destroy(conn->qp, &conn->qp->rdma_mrs);
	rdma_destroy_qp(conn->cm_id);
	ib_free_cq(conn->cq);
	ib_dealloc_pd(conn->pd);
}
