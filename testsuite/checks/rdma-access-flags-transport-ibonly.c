// RUN: %check_ulplint --kernel %s rdma-access-flags-transport %t

// Near miss: an InfiniBand-only ULP (its device hook refuses other
// transports) may READ into local_dma_lkey memory. Nothing is reported.

#include <rdma/ib_verbs.h>

struct demo_conn {
	struct ib_device *dev;
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct ib_rdma_wr rdma_wr;
	struct ib_sge sge;
	u32 port;
};

static int demo_add_one(struct demo_conn *c)
{
	if (!rdma_protocol_ib(c->dev, c->port))
		return -EOPNOTSUPP;
	return 0;
}

static int demo_read(struct demo_conn *c, u64 dma, u32 len, u64 raddr, u32 rkey)
{
	c->sge.addr = dma;
	c->sge.length = len;
	c->sge.lkey = c->pd->local_dma_lkey;
	c->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	c->rdma_wr.wr.sg_list = &c->sge;
	c->rdma_wr.wr.num_sge = 1;
	c->rdma_wr.remote_addr = raddr;
	c->rdma_wr.rkey = rkey;
	return ib_post_send(c->qp, &c->rdma_wr.wr, NULL);
}
