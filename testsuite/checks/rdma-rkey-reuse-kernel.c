// RUN: %check_ulplint --kernel %s rdma-rkey-reuse %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-rkey-reuse %t.plugin

// Pooled fast-registration MRs registered again for every I/O.

#include <rdma/mr_pool.h>

struct demo_queue {
	struct ib_qp *qp;
};

struct demo_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct scatterlist *sgl;
	int nents;
};

struct demo_ok_req {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
};

static int demo_map(struct demo_queue *q, struct demo_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	if (ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K) < req->nents) {
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		return -EINVAL;
	}
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: IB_WR_REG_MR re-registers an MR without rotating its key (ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey))); a peer that kept the old rkey reaches the new buffer [rdma-rkey-reuse]
	// CHECK-MESSAGES: :[[@LINE-10]]:12: note: MR taken from 'ib_mr_pool_get' here
	// CHECK-FIXES: ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	// CHECK-FIXES-NEXT: req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

/* Near miss: nvme-rdma rotates the key before each registration. */
static int ok_map(struct demo_queue *q, struct demo_ok_req *req)
{
	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(q->qp, &req->reg_wr.wr, NULL);
}

/* Rotations in the registering function itself must give every
 * registration its new key. */
struct demo_slot {
	struct ib_qp *qp;
	struct ib_mr *data_mr;
	struct ib_mr *meta_mr;
	struct ib_mr *tail_mr;
	struct ib_reg_wr reg_wr[3];
	int retries;
	__le32 data_key, meta_key, tail_key;
};

/* Only a retried command gets a new key. */
int demo_reg_data(struct demo_slot *s)
{
	struct ib_reg_wr *wr = &s->reg_wr[0];

	if (s->retries)
		ib_update_fast_reg_key(s->data_mr, ib_inc_rkey(s->data_mr->rkey));
	wr->wr.opcode = IB_WR_REG_MR;
	wr->mr = s->data_mr;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: IB_WR_REG_MR may re-register an MR with its previous key: the key is rotated on some paths only
	wr->key = s->data_mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	s->data_key = cpu_to_le32(s->data_mr->rkey);
	return ib_post_send(s->qp, &wr->wr, NULL);
}

/* The "update" writes back the key byte the MR already has. */
int demo_reg_meta(struct demo_slot *s)
{
	struct ib_reg_wr *wr = &s->reg_wr[1];
	u8 key = s->meta_mr->rkey & 0xff;

	ib_update_fast_reg_key(s->meta_mr, key);
	wr->wr.opcode = IB_WR_REG_MR;
	wr->mr = s->meta_mr;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: IB_WR_REG_MR may re-register an MR with its previous key: the key written back is not a new one
	wr->key = s->meta_mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	s->meta_key = cpu_to_le32(s->meta_mr->rkey);
	return ib_post_send(s->qp, &wr->wr, NULL);
}

/* The key is captured for the work request before it is rotated. */
int demo_reg_tail(struct demo_slot *s)
{
	struct ib_reg_wr *wr = &s->reg_wr[2];

	wr->wr.opcode = IB_WR_REG_MR;
	wr->mr = s->tail_mr;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: IB_WR_REG_MR may re-register an MR with its previous key: the key is rotated only after the registration took it
	wr->key = s->tail_mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	s->tail_key = cpu_to_le32(s->tail_mr->rkey);
	ib_update_fast_reg_key(s->tail_mr, ib_inc_rkey(s->tail_mr->rkey));
	return ib_post_send(s->qp, &wr->wr, NULL);
}

/* Near misses: xprtrdma's frwr_map() bumps the key byte; RDS uses a
 * rolling counter. Both are new keys on every path. */
struct demo_frwr {
	struct ib_qp *qp;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	u8 remap_count;
};

int demo_frwr_map(struct demo_frwr *f)
{
	u8 key = (u8)(f->mr->rkey & 0x000000FF);

	ib_update_fast_reg_key(f->mr, ++key);
	f->reg_wr.wr.opcode = IB_WR_REG_MR;
	f->reg_wr.mr = f->mr;
	f->reg_wr.key = f->mr->rkey;
	f->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(f->qp, &f->reg_wr.wr, NULL);
}

int demo_rds_reg(struct demo_frwr *f)
{
	ib_update_fast_reg_key(f->mr, f->remap_count++);
	f->reg_wr.wr.opcode = IB_WR_REG_MR;
	f->reg_wr.mr = f->mr;
	f->reg_wr.key = f->mr->rkey;
	f->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;
	return ib_post_send(f->qp, &f->reg_wr.wr, NULL);
}
