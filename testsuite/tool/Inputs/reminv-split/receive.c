#include "reminv.h"

void rs_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rs_rep *rep = container_of(wc->wr_cqe, struct rs_rep, cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	rep->wc_flags = wc->wc_flags;
	/* Only a record of the invalidation for the reply handler. */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
		rep->inv_rkey = wc->ex.invalidate_rkey;
	else
		rep->inv_rkey = 0;
	rs_reply_handler(rep);
}
