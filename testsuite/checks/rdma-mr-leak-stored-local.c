// RUN: %check_ulplint --kernel %s rdma-mr-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-mr-leak %t.plugin

// A target's per-command registration: the MR is taken into a local
// (from the pool, or allocated when the pool runs dry), stored into the
// command the caller passed, and the mapping fails afterwards. Storing it
// through a local is the same as storing the call's result directly: the
// command holds a handle this function produced, and its error return
// abandons it unless the caller or the function releases it.

#include <linux/err.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define TG_PAGES 32

struct tg_ch {
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct ib_device *dev;
	struct list_head fr_pool;
};

struct tg_cmd {
	struct ib_mr *mr;
	bool mr_from_alloc;
	struct scatterlist sg[TG_PAGES];
	int sg_cnt;
	int nents;
	struct ib_reg_wr reg_wr;
};

struct tg_dump {
	struct ib_mr *mr;
	struct scatterlist sgl[1];
	int nents;
};

static int tg_map_cmd(struct tg_ch *ch, struct tg_cmd *cmd)
{
	struct ib_mr *mr;
	int n;

	cmd->nents = ib_dma_map_sg(ch->dev, cmd->sg, cmd->sg_cnt, DMA_FROM_DEVICE);
	if (!cmd->nents)
		return -EIO;

	cmd->mr_from_alloc = false;
	mr = ib_mr_pool_get(ch->qp, &ch->fr_pool);
	if (!mr) {
		mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, TG_PAGES);
		if (IS_ERR(mr))
			goto out_unmap;
		cmd->mr_from_alloc = true;
	}
	cmd->mr = mr;

	n = ib_map_mr_sg(mr, cmd->sg, cmd->nents, NULL, PAGE_SIZE);
	if (n < cmd->nents)
		return -EINVAL;
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory region from 'ib_mr_pool_get' (held in tg_cmd.mr); it leaks [rdma-mr-leak]
	// CHECK-MESSAGES: :[[@LINE-13]]:7: note: memory region obtained here
	// CHECK-MESSAGES: :[[@LINE-4]]:2: note: error path taken here

	cmd->reg_wr.wr.opcode = IB_WR_REG_MR;
	cmd->reg_wr.mr = mr;
	return 0;

out_unmap:
	ib_dma_unmap_sg(ch->dev, cmd->sg, cmd->sg_cnt, DMA_FROM_DEVICE);
	return -ENOMEM;
}

int tg_get_write_data(struct tg_ch *ch, struct tg_cmd *cmd)
{
	int ret;

	ret = tg_map_cmd(ch, cmd);
	if (ret)
		return ret;
	return ib_post_send(ch->qp, &cmd->reg_wr.wr, NULL);
}

/* Near miss: the connection's dump MR is allocated once, on first use,
 * and kept there; teardown deregisters it. An error return leaves it for
 * the next dump. */
int tg_dump_export(struct tg_ch *ch, struct tg_dump *d, void *buf, size_t len)
{
	struct ib_mr *mr;

	if (!d->mr) {
		mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, TG_PAGES);
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		d->mr = mr;
	}
	sg_init_one(d->sgl, buf, len);
	d->nents = ib_dma_map_sg(ch->dev, d->sgl, 1, DMA_TO_DEVICE);
	if (!d->nents)
		return -EIO;
	if (ib_map_mr_sg(d->mr, d->sgl, d->nents, NULL, PAGE_SIZE) != d->nents)
		return -EIO;
	return 0;
}

void tg_dump_teardown(struct tg_dump *d)
{
	if (d->mr)
		ib_dereg_mr(d->mr);
	d->mr = NULL;
}

/* Near miss: the local keeps naming the MR after the store; the failed
 * post clears the command's copy and deregisters through the local. */
int tg_submit_once(struct tg_ch *ch, struct tg_cmd *cmd)
{
	struct ib_mr *mr;
	int ret;

	mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, TG_PAGES);
	if (IS_ERR(mr))
		return PTR_ERR(mr);
	cmd->mr = mr;
	cmd->reg_wr.wr.opcode = IB_WR_REG_MR;
	cmd->reg_wr.mr = mr;
	ret = ib_post_send(ch->qp, &cmd->reg_wr.wr, NULL);
	if (ret) {
		cmd->mr = NULL;
		ib_dereg_mr(mr);
	}
	return ret;
}

void tg_cmd_done(struct tg_ch *ch, struct tg_cmd *cmd)
{
	if (cmd->mr_from_alloc)
		ib_dereg_mr(cmd->mr);
	else
		ib_mr_pool_put(ch->qp, &ch->fr_pool, cmd->mr);
	cmd->mr = NULL;
}

/* A session's permits, each with its own MR, stored through a pointer
 * into the caller's array. When the message buffer of permit i fails, the
 * unwinding loop stops below i: permit i's MR goes with the array. */
struct tg_permit {
	struct ib_mr *mr;
	void *msg;
};

struct tg_sess {
	struct ib_pd *pd;
	struct tg_permit *permits;
	int depth;
};

int tg_alloc_permits(struct tg_sess *s)
{
	struct tg_permit *p;
	struct ib_mr *mr;
	int i, ret;

	s->permits = kcalloc(s->depth, sizeof(*s->permits), GFP_KERNEL);
	if (!s->permits)
		return -ENOMEM;
	for (i = 0; i < s->depth; i++) {
		p = &s->permits[i];
		mr = ib_alloc_mr(s->pd, IB_MR_TYPE_MEM_REG, TG_PAGES);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto err_unwind;
		}
		p->mr = mr;
		p->msg = kzalloc(64, GFP_KERNEL);
		if (!p->msg) {
			ret = -ENOMEM;
			goto err_unwind;
		}
	}
	return 0;

err_unwind:
	while (i--) {
		p = &s->permits[i];
		kfree(p->msg);
		ib_dereg_mr(p->mr);
	}
	kfree(s->permits);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'kfree' frees the struct that still holds a memory region from 'ib_alloc_mr'; it leaks [rdma-mr-leak]
	// CHECK-MESSAGES: :[[@LINE-22]]:8: note: memory region obtained here
	s->permits = NULL;
	return ret;
}
