/* An xprtrdma-style split: the receive handler copies the completion into
 * the reply, the reply handler tests the copied flags and hands the copied
 * key to the MR code of another file, which compares it with each MR's. */
#include <rdma/ib_verbs.h>
#include <linux/list.h>

struct rs_mr {
	struct ib_mr *ibmr;
	u32 handle;
	struct list_head list;
};

struct rs_req {
	struct list_head registered;
};

struct rs_rep {
	struct ib_cqe cqe;
	u32 wc_flags;
	u32 inv_rkey;
	struct rs_req *req;
};

void rs_reply_handler(struct rs_rep *rep);
void rs_reminv(u32 inv_rkey, struct list_head *mrs);
void rs_mr_put(struct rs_mr *mr);
