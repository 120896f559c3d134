// SPDX-License-Identifier: GPL-2.0
/*
 * verbs.c - receive completions, disconnect handling and MR lists for
 * the zf client.
 *
 * Correct: the receive handler only records which handle the server
 * invalidated (the reply handler matches it); MR creation frees only MR
 * shells whose initialization failed; teardown deregisters every MR.
 */
#include "zf.h"
#include <linux/slab.h>

void zf_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zf_rep *rep = container_of(wc->wr_cqe, struct zf_rep, rr_cqe);
	struct zf_xprt *xprt = rep->rr_xprt;

	if (wc->status != IB_WC_SUCCESS)
		goto out_flushed;
	if (wc->byte_len < sizeof(u32))
		goto out_short;

	rep->rr_wc_flags = wc->wc_flags;
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)	/* OK: rdma-remote-invalidate-unchecked -- only records the invalidated handle for zf_reply_handler() */
		rep->rr_inv_rkey = wc->ex.invalidate_rkey;
	else
		rep->rr_inv_rkey = 0;
	rep->rr_xid = *(u32 *)rep->rr_buf;

	zf_reply_handler(rep);
	return;

out_short:
	pr_warn("zf: short reply (%u bytes)\n", wc->byte_len);
	return;
out_flushed:
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("zf: receive: %s\n", ib_wc_status_msg(wc->status));
	zf_force_disconnect(xprt);
}

void zf_mrs_create(struct zf_xprt *xprt)
{
	unsigned int count;

	for (count = 0; count < xprt->rx_max_mrs; count++) {
		struct zf_mr *mr;
		int rc;

		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			break;

		rc = zf_mr_init(xprt, mr);
		if (rc) {
			kfree(mr);	/* OK: rdma-mr-leak -- a failed zf_mr_init() stored no MR in *mr */
			break;
		}

		spin_lock(&xprt->rx_mr_lock);
		list_add(&mr->mr_list, &xprt->rx_mrs);
		list_add(&mr->mr_all, &xprt->rx_all_mrs);
		spin_unlock(&xprt->rx_mr_lock);
	}
}

void zf_mrs_destroy(struct zf_xprt *xprt)
{
	struct zf_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &xprt->rx_all_mrs, mr_all) {
		list_del(&mr->mr_all);
		list_del_init(&mr->mr_list);
		zf_mr_release(mr);
	}
}

void zf_disconnect_worker(struct work_struct *work)
{
	struct zf_xprt *xprt = container_of(work, struct zf_xprt,
					    rx_disconnect_work);

	ib_drain_qp(xprt->rx_qp);
	zf_mrs_destroy(xprt);
}
