/* The same ULP's data path: an RDMA READ into the local DMA lkey. */
#include <rdma/ib_verbs.h>

struct demo_conn {
	struct ib_qp *qp;
	struct ib_pd *pd;
	struct ib_rdma_wr rdma_wr;
	struct ib_sge sge;
};

int demo_xmit_read(struct demo_conn *c, u64 dma, u32 len, u64 raddr, u32 rkey)
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
