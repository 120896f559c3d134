#include "reminv.h"

void rs_mr_map(struct rs_mr *mr)
{
	mr->handle = mr->ibmr->rkey;
}

void rs_reminv(u32 inv_rkey, struct list_head *mrs)
{
	struct rs_mr *mr;

	list_for_each_entry(mr, mrs, list)
		if (mr->handle == inv_rkey) {
			list_del_init(&mr->list);
			rs_mr_put(mr);
			break;
		}
}
