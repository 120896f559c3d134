#include "reminv.h"

void rs_reply_handler(struct rs_rep *rep)
{
	if (rep->wc_flags & IB_WC_WITH_INVALIDATE)
		rs_reminv(rep->inv_rkey, &rep->req->registered);
}
