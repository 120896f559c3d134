// SPDX-License-Identifier: GPL-2.0
/*
 * lsr: the standby side of the invented log shipper. At connection setup it
 * allocates the log ring, DMA-maps it, fast-registers it once with
 * LOCAL_WRITE | REMOTE_WRITE and sends the ring's address and rkey to the
 * primary in the handshake reply; the primary writes records straight into
 * it. The ring stays registered for the whole connection (one registration,
 * no key rotation needed).
 *
 * The bug is in teardown: lsr_free_ring() unmaps and frees the ring pages
 * before deregistering the MR, so for that window the primary's rkey still
 * reaches pages the allocator may already have handed out. The error path
 * of setup deregisters first and is fine.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct lsr_hello_rep {
	__be64	ring_addr;
	__be32	ring_rkey;
	__be32	slots;
};

struct lsr_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	void			*ring;
	size_t			ring_size;
	struct sg_table		ring_sgt;
	int			ring_nents;
	struct ib_mr		*ring_mr;
	struct ib_cqe		reg_cqe;
	struct completion	reg_done;
	enum ib_wc_status	reg_status;
	u32			slots;
};

static void lsr_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct lsr_conn *conn = container_of(wc->wr_cqe, struct lsr_conn,
					     reg_cqe);

	conn->reg_status = wc->status;
	complete(&conn->reg_done);
}

int lsr_setup_ring(struct lsr_conn *conn, struct lsr_hello_rep *rep)
{
	struct ib_reg_wr reg_wr;
	int n, ret;

	conn->ring_nents = ib_dma_map_sg(conn->ibdev, conn->ring_sgt.sgl,
					 conn->ring_sgt.nents, DMA_FROM_DEVICE);
	if (!conn->ring_nents)
		return -ENOMEM;

	/* BUG: rdma-local-mr-management -- the standby allocates its own MR for the ring */
	conn->ring_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
				    conn->ring_nents); /* OK: rdma-registration-in-datapath -- once per connection, before the ring is advertised */
	if (IS_ERR(conn->ring_mr)) {
		ret = PTR_ERR(conn->ring_mr);
		goto out_unmap;
	}

	/* BUG: rdma-local-mr-management -- the standby maps the ring into its MR */
	n = ib_map_mr_sg(conn->ring_mr, conn->ring_sgt.sgl, conn->ring_nents,
			 NULL, PAGE_SIZE);
	if (n != conn->ring_nents) {
		ret = -EINVAL;
		goto out_dereg;
	}

	memset(&reg_wr, 0, sizeof(reg_wr));
	conn->reg_cqe.done = lsr_reg_done;
	init_completion(&conn->reg_done);
	reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the standby */
	reg_wr.wr.wr_cqe = &conn->reg_cqe;
	reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	reg_wr.mr = conn->ring_mr; /* OK: rdma-rkey-reuse -- the ring MR is registered exactly once */
	reg_wr.key = conn->ring_mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE accompanies REMOTE_WRITE, and the rkey goes to the primary */
	reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	ret = ib_post_send(conn->qp, &reg_wr.wr, NULL);
	if (ret)
		goto out_dereg;
	wait_for_completion(&conn->reg_done);
	if (conn->reg_status != IB_WC_SUCCESS) {
		ret = -EIO;
		goto out_dereg;
	}

	rep->ring_addr = cpu_to_be64(conn->ring_mr->iova);
	rep->ring_rkey = cpu_to_be32(conn->ring_mr->rkey);
	rep->slots = cpu_to_be32(conn->slots);
	return 0;

out_dereg:
	/* BUG: rdma-local-mr-management -- the standby deregisters its MR */
	ib_dereg_mr(conn->ring_mr); /* OK: rdma-invalidation-leak, rdma-mr-leak -- deregistered before the ring is unmapped */
	conn->ring_mr = NULL;
out_unmap:
	ib_dma_unmap_sg(conn->ibdev, conn->ring_sgt.sgl, conn->ring_sgt.nents,
			DMA_FROM_DEVICE);
	return ret;
}

void lsr_free_ring(struct lsr_conn *conn)
{
	/* BUG: rdma-invalidation-leak -- the ring is unmapped while the rkey handed to the primary is still valid; the MR is deregistered only afterwards */
	ib_dma_unmap_sg(conn->ibdev, conn->ring_sgt.sgl, conn->ring_sgt.nents,
			DMA_FROM_DEVICE);
	kfree(conn->ring);
	conn->ring = NULL;
	if (conn->ring_mr) {
		/* BUG: rdma-local-mr-management -- the standby deregisters its MR */
		ib_dereg_mr(conn->ring_mr);
		conn->ring_mr = NULL;
	}
}
