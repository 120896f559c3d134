// RUN: %check_ulplint --kernel %s rdma-access-flags-transport %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-access-flags-transport %t.plugin
// RUN: %check_ulplint --kernel --check-suffixes=CORE %s rdma-access-flags-transport %t.core -- \
// RUN:   --config="{CheckOptions: {CoreFiles: 'Output/'}}"

// Kernel ULP code that re-implements rdma_rw's transport-specific choices.
// The CORE run shows that files of the RDMA core itself are not judged.

#include <rdma/rw.h>
#include <linux/slab.h>

struct demo_port {
	struct ib_device *dev;
	struct ib_pd *pd;
	struct ib_qp *qp;
	u32 port_num;
};

struct demo_read_ctx {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_rdma_wr rdma_wr;
	struct ib_sge sge;
	struct ib_cqe cqe;
	struct rdma_rw_ctx rw;
};

/* (a) rw.c's iWARP rule, copied into the ULP. */
static void demo_prep_sink(struct demo_port *p, struct demo_read_ctx *ctx)
{
	ctx->reg_wr.wr.opcode = IB_WR_REG_MR;
	ctx->reg_wr.mr = ctx->mr;
	ctx->reg_wr.key = ctx->mr->rkey;
	ctx->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	if (rdma_protocol_iwarp(p->dev, p->port_num))
		ctx->reg_wr.access |= IB_ACCESS_REMOTE_WRITE;
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: access flags for 'IB_WR_REG_MR' are chosen by an inline transport test; let rdma_rw_ctx_init() register the buffer (it gives iWARP READ sinks REMOTE_WRITE itself) or derive the rights from device capabilities in one place [rdma-access-flags-transport]
	// CHECK-MESSAGES: :[[@LINE-3]]:6: note: transport tested here
}

/* (a) The same as a ternary on rdma_cap_read_inv(). */
static int demo_sink_access(struct demo_port *p)
{
	return 0;
}

static void demo_prep_sink2(struct demo_port *p, struct demo_read_ctx *ctx)
{
	ctx->reg_wr.access = rdma_cap_read_inv(p->dev, p->port_num) ?
		IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
		IB_ACCESS_LOCAL_WRITE;
	// CHECK-MESSAGES: :[[@LINE-3]]:2: warning: access flags for 'IB_WR_REG_MR' are chosen by an inline transport test
	// CHECK-MESSAGES: :[[@LINE-4]]:23: note: transport tested here
}

/* (b) A hand-built RDMA READ into memory addressed by the local DMA lkey. */
static int demo_read_into(struct demo_port *p, struct demo_read_ctx *ctx,
			  u64 dma_addr, u32 len, u64 raddr, u32 rkey)
{
	ctx->sge.addr = dma_addr;
	ctx->sge.length = len;
	ctx->sge.lkey = p->pd->local_dma_lkey;
	ctx->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: RDMA READ into memory addressed with the PD's local_dma_lkey; on iWARP a READ sink must be registered with IB_ACCESS_REMOTE_WRITE; let rdma_rw_ctx_init() register the buffer
	ctx->rdma_wr.wr.sg_list = &ctx->sge;
	ctx->rdma_wr.wr.num_sge = 1;
	ctx->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	ctx->rdma_wr.wr.wr_cqe = &ctx->cqe;
	ctx->rdma_wr.remote_addr = raddr;
	ctx->rdma_wr.rkey = rkey;
	return ib_post_send(p->qp, &ctx->rdma_wr.wr, NULL);
}

/* (b) A READ sink fast-registered with LOCAL_WRITE only. */
static int demo_read_registered(struct demo_port *p, struct demo_read_ctx *ctx,
				u64 raddr, u32 rkey)
{
	ctx->reg_wr.wr.opcode = IB_WR_REG_MR;
	ctx->reg_wr.mr = ctx->mr;
	ctx->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	ctx->reg_wr.wr.next = &ctx->rdma_wr.wr;
	ctx->sge.lkey = ctx->mr->lkey;
	ctx->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: RDMA READ into memory registered without IB_ACCESS_REMOTE_WRITE; on iWARP the READ response is a tagged write into the sink, so the READ fails; let rdma_rw_ctx_init() register the buffer
	// CHECK-MESSAGES: :[[@LINE-5]]:2: note: the sink is registered here
	ctx->rdma_wr.wr.sg_list = &ctx->sge;
	ctx->rdma_wr.wr.num_sge = 1;
	ctx->rdma_wr.remote_addr = raddr;
	ctx->rdma_wr.rkey = rkey;
	return ib_post_send(p->qp, &ctx->reg_wr.wr, NULL);
}

/* (a) The choice spelled as if/else on the node's transport: one choice,
 * reported once. */
static void demo_prep_sink_legacy(struct demo_port *p, struct demo_read_ctx *ctx,
				  unsigned int node_type)
{
	ctx->reg_wr.wr.opcode = IB_WR_REG_MR;
	ctx->reg_wr.mr = ctx->mr;
	if (rdma_node_get_transport(node_type) == RDMA_TRANSPORT_IWARP)
		ctx->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	else
		ctx->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	// CHECK-MESSAGES: :[[@LINE-3]]:3: warning: access flags for 'IB_WR_REG_MR' are chosen by an inline transport test
	// CHECK-MESSAGES: :[[@LINE-5]]:6: note: transport tested here
}

/* (b) A helper builds the RDMA work request for the opcode its caller
 * picks; the caller sets the registration's rights. The pull (a READ into
 * a LOCAL_WRITE-only MR) is reported at its call; the push (a WRITE) is
 * not. */
struct demo_xfer {
	struct demo_port *port;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_rdma_wr rdma_wr;
	struct ib_sge sge;
};

static void demo_xfer_build(struct demo_xfer *x, enum ib_wr_opcode op,
			    u64 raddr, u32 rkey)
{
	x->reg_wr.wr.opcode = IB_WR_REG_MR;
	x->reg_wr.mr = x->mr;
	x->sge.addr = x->mr->iova;
	x->sge.length = x->mr->length;
	x->sge.lkey = x->mr->lkey;
	x->rdma_wr.wr.opcode = op;
	x->rdma_wr.wr.sg_list = &x->sge;
	x->rdma_wr.wr.num_sge = 1;
	x->rdma_wr.remote_addr = raddr;
	x->rdma_wr.rkey = rkey;
	x->reg_wr.wr.next = &x->rdma_wr.wr;
}

int demo_xfer_pull(struct demo_xfer *x, u64 raddr, u32 rkey)
{
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	demo_xfer_build(x, IB_WR_RDMA_READ, raddr, rkey);
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: RDMA READ into memory registered without IB_ACCESS_REMOTE_WRITE
	// CHECK-MESSAGES: :[[@LINE-3]]:2: note: the sink is registered here
	return ib_post_send(x->port->qp, &x->reg_wr.wr, NULL);
}

int demo_xfer_push(struct demo_xfer *x, u64 raddr, u32 rkey)
{
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	demo_xfer_build(x, IB_WR_RDMA_WRITE, raddr, rkey);
	return ib_post_send(x->port->qp, &x->reg_wr.wr, NULL);
}

/* Near misses. */

/* rdma_rw chooses the registration and its rights. */
static int ok_rdma_rw(struct demo_port *p, struct demo_read_ctx *ctx,
		      struct scatterlist *sg, u32 nents, u64 raddr, u32 rkey)
{
	int ret = rdma_rw_ctx_init(&ctx->rw, p->qp, p->port_num, sg, nents, 0,
				   raddr, rkey, DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	return rdma_rw_ctx_post(&ctx->rw, p->qp, p->port_num, &ctx->cqe, NULL);
}

/* An RDMA WRITE source needs no remote rights. */
static int ok_write_from(struct demo_port *p, struct demo_read_ctx *ctx,
			 u64 dma_addr, u32 len, u64 raddr, u32 rkey)
{
	ctx->sge.addr = dma_addr;
	ctx->sge.length = len;
	ctx->sge.lkey = p->pd->local_dma_lkey;
	ctx->rdma_wr.wr.opcode = IB_WR_RDMA_WRITE;
	ctx->rdma_wr.wr.sg_list = &ctx->sge;
	ctx->rdma_wr.wr.num_sge = 1;
	ctx->rdma_wr.remote_addr = raddr;
	ctx->rdma_wr.rkey = rkey;
	return ib_post_send(p->qp, &ctx->rdma_wr.wr, NULL);
}

/* A transport test that only sizes a queue. */
static u32 ok_sge_count(struct demo_port *p)
{
	return rdma_protocol_iwarp(p->dev, p->port_num) ? 1 : 4;
}
