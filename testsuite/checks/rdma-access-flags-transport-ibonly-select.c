// RUN: %check_ulplint %s rdma-access-flags-transport %t

// Near miss: a benchmark that opens only InfiniBand devices. Its device
// selection loop skips the others with `continue`, so no iWARP device is
// ever used, and its READ sink needs no REMOTE_WRITE. Nothing is reported.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

struct rl_ctx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	void *buf;
	size_t size;
	struct ibv_mr *mr;
};

static struct ibv_context *rl_open_ib_device(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	if (!list)
		return NULL;
	for (i = 0; list[i]; i++) {
		if (list[i]->transport_type != IBV_TRANSPORT_IB)
			continue;
		if (name && strcmp(ibv_get_device_name(list[i]), name))
			continue;
		ctx = ibv_open_device(list[i]);
		if (ctx)
			break;
	}
	ibv_free_device_list(list);
	return ctx;
}

int rl_setup(struct rl_ctx *c, const char *name)
{
	c->ctx = rl_open_ib_device(name);
	if (!c->ctx)
		return -1;
	c->mr = ibv_reg_mr(c->pd, c->buf, c->size, IBV_ACCESS_LOCAL_WRITE);
	return c->mr ? 0 : -1;
}

int rl_read(struct rl_ctx *c, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)c->buf, (uint32_t)c->size, c->mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;

	return ibv_post_send(c->qp, &wr, &bad);
}
