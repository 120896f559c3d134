// SPDX-License-Identifier: GPL-2.0
/*
 * kc_isert_tgt.c - iSER style target data mover (ib_isert style).  Data-Out is
 * pulled with RDMA READ and Data-In pushed with RDMA WRITE through rdma_rw
 * contexts (max_rdma_ctxs, port_num).  The T10 protection information lives
 * in a separate buffer that is still registered by hand (no signature offload
 * on the original adapters): per-command MR, IB_WR_REG_MR and an RDMA op
 * chained to the rdma_rw chain, signaled LOCAL_INV before the unmap.
 * Known problems: the hand-made PI registration (rdma_rw_ctx_signature_init()
 * does this) picks access with an inline iWARP test and never rotates its key;
 * a failed Data-Out READ recycles the command without invalidating the PI
 * sink; the SQ forgets the PI LOCAL_INV; the TX SGE count is not checked;
 * one-page Data-Out bypasses rdma_rw with a local_dma_lkey READ sink; the
 * command-table unwinding misses the MR of the failing entry.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/mm.h>
#include <rdma/rw.h>

#define KC_ISERT_TX_SGES	8	/* iSER header + 7 immediate-data pages */
#define KC_ISERT_MAX_TX_MISC	4	/* NOPs, async events, logout */
#define KC_ISERT_PI_PAGES	4
#define KC_ISERT_HDR_LEN	76

struct kc_isert_cmd {
	struct kc_isert_conn	*conn;
	struct list_head	list;		/* conn->free_cmds */
	struct rdma_rw_ctx	rw;
	struct scatterlist	*sg;
	u32			sg_cnt;
	enum dma_data_direction	dir;
	u64			remote_va;	/* from the iSER header */
	u32			remote_stag;
	bool			pi;
	u64			pi_va;
	u32			pi_stag;
	struct ib_mr		*pi_mr;
	struct scatterlist	pi_sg[KC_ISERT_PI_PAGES];
	int			pi_nents;
	struct ib_reg_wr	pi_reg_wr;
	struct ib_rdma_wr	pi_rdma_wr;
	struct ib_sge		pi_sge;
	struct ib_send_wr	pi_inv_wr;
	struct ib_cqe		rw_cqe, pi_inv_cqe, tx_cqe;
	struct ib_send_wr	tx_wr;
	struct ib_sge		tx_sge;
	void			*tx_buf;
	u64			tx_dma;
};

struct kc_isert_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			port_num;
	u32			cmds_max;
	struct kc_isert_cmd	*cmds;
	spinlock_t		lock;
	struct list_head	free_cmds;
};

/* provided by the iSCSI target core */
void kc_isert_execute_cmd(struct kc_isert_cmd *cmd);

static void kc_isert_pi_inv_done(struct ib_cq *cq, struct ib_wc *wc);

int kc_isert_create_qp(struct kc_isert_conn *conn)
{
	struct ib_qp_init_attr attr = {};
	int ret;

	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	/* response SEND + PI REG_MR + PI RDMA per command; rdma_rw adds its own */
	/* BUG(file): rdma-send-queue-undersized -- the PI LOCAL_INV posted from the completion path is not counted: 4 WRs per command against 3 */
	attr.cap.max_send_wr = 3 * conn->cmds_max + KC_ISERT_MAX_TX_MISC; /* OK: rdma-send-queue-manual-factor -- the QP declares max_rdma_ctxs */
	attr.cap.max_rdma_ctxs = conn->cmds_max;
	attr.cap.max_recv_wr = conn->cmds_max + 1;
	attr.cap.max_send_sge = KC_ISERT_TX_SGES; /* BUG(file): rdma-queue-cap-unchecked -- 8 send SGEs requested without looking at attrs.max_send_sge */
	attr.cap.max_recv_sge = 1;
	attr.port_num = conn->port_num;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(conn->cm_id, conn->pd, &attr);
	if (!ret)
		conn->qp = conn->cm_id->qp;
	return ret;
}

static void kc_isert_free_cmds(struct kc_isert_conn *conn, u32 n)
{
	struct kc_isert_cmd *cmd;
	u32 i;

	for (i = 0; i < n; i++) {
		cmd = &conn->cmds[i];
		if (cmd->pi_mr)
			ib_dereg_mr(cmd->pi_mr); /* BUG: rdma-local-mr-management -- hand-managed PI MR; rdma_rw_ctx_signature_init() owns these */
		ib_dma_unmap_single(conn->ibdev, cmd->tx_dma, KC_ISERT_HDR_LEN,
				    DMA_TO_DEVICE);
		kfree(cmd->tx_buf);
	}
	kfree(conn->cmds);
	conn->cmds = NULL;
}

int kc_isert_alloc_cmds(struct kc_isert_conn *conn)
{
	struct kc_isert_cmd *cmd;
	u32 i;

	conn->cmds = kcalloc(conn->cmds_max, sizeof(*cmd), GFP_KERNEL);
	if (!conn->cmds)
		return -ENOMEM;

	INIT_LIST_HEAD(&conn->free_cmds);
	for (i = 0; i < conn->cmds_max; i++) {
		cmd = &conn->cmds[i];
		cmd->conn = conn;
		/* OK: rdma-registration-in-datapath -- the whole table is set up once per connection */
		cmd->pi_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, KC_ISERT_PI_PAGES); /* BUG: rdma-local-mr-management -- PI registration managed by hand instead of an rdma_rw signature context */
		if (IS_ERR(cmd->pi_mr)) {
			cmd->pi_mr = NULL;
			goto out_free;
		}

		cmd->tx_buf = kzalloc(KC_ISERT_HDR_LEN, GFP_KERNEL);
		if (cmd->tx_buf)
			cmd->tx_dma = ib_dma_map_single(conn->ibdev, cmd->tx_buf,
					KC_ISERT_HDR_LEN, DMA_TO_DEVICE);
		if (!cmd->tx_buf || ib_dma_mapping_error(conn->ibdev, cmd->tx_dma)) {
			kfree(cmd->tx_buf);
			goto out_free; /* BUG: rdma-mr-leak -- kc_isert_free_cmds(conn, i) stops below i: this command's PI MR is never deregistered */
		}
		list_add_tail(&cmd->list, &conn->free_cmds);
	}
	return 0;

out_free:
	kc_isert_free_cmds(conn, i);
	return -ENOMEM;
}

struct kc_isert_cmd *kc_isert_get_cmd(struct kc_isert_conn *conn)
{
	struct kc_isert_cmd *cmd;
	unsigned long flags;

	spin_lock_irqsave(&conn->lock, flags);
	cmd = list_first_entry_or_null(&conn->free_cmds, struct kc_isert_cmd,
				       list);
	if (cmd)
		list_del_init(&cmd->list);
	spin_unlock_irqrestore(&conn->lock, flags);
	return cmd;
}

static void kc_isert_put_cmd(struct kc_isert_conn *conn,
			     struct kc_isert_cmd *cmd)
{
	unsigned long flags;

	cmd->pi = false;
	spin_lock_irqsave(&conn->lock, flags);
	list_add(&cmd->list, &conn->free_cmds);
	spin_unlock_irqrestore(&conn->lock, flags);
}

/* A PI MR is dropped after a failed invalidation; allocate its successor. */
static struct ib_mr *kc_isert_pi_mr(struct kc_isert_conn *conn,
				    struct kc_isert_cmd *cmd)
{
	if (!cmd->pi_mr) {
		/* OK: rdma-registration-in-datapath -- allocated on first use after a recovery, then kept by the command */
		cmd->pi_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, KC_ISERT_PI_PAGES); /* BUG: rdma-local-mr-management -- PI MR still allocated by the ULP */
		if (IS_ERR(cmd->pi_mr)) {
			cmd->pi_mr = NULL;
			return NULL;
		}
	}
	return cmd->pi_mr;
}

/* Build REG_MR + RDMA READ/WRITE for the protection information. */
static int kc_isert_reg_pi(struct kc_isert_conn *conn, struct kc_isert_cmd *cmd)
{
	struct ib_mr *mr = kc_isert_pi_mr(conn, cmd);
	int access, n;

	if (!mr)
		return -ENOMEM;
	n = ib_dma_map_sg(conn->ibdev, cmd->pi_sg, cmd->pi_nents, cmd->dir);
	if (!n)
		return -EIO;
	if (ib_map_mr_sg(mr, cmd->pi_sg, n, NULL, PAGE_SIZE) != n) { /* BUG: rdma-local-mr-management -- hand-made PI mapping, the data transfer belongs in rdma_rw */
		ib_dma_unmap_sg(conn->ibdev, cmd->pi_sg, cmd->pi_nents, cmd->dir);
		return -EINVAL; /* OK: rdma-mr-leak -- cmd->pi_mr stays cached in the command for its next I/O */
	}

	access = IB_ACCESS_LOCAL_WRITE;
	if (cmd->dir == DMA_FROM_DEVICE &&
	    rdma_protocol_iwarp(conn->ibdev, conn->port_num))
		/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE only on the sink of an iWARP RDMA READ */
		access |= IB_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-transport -- access flags chosen by an inline rdma_protocol_iwarp() test */

	memset(&cmd->pi_reg_wr, 0, sizeof(cmd->pi_reg_wr));
	cmd->pi_reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- REG_MR posted by the ULP for its own RDMA op */
	cmd->pi_reg_wr.wr.next = &cmd->pi_rdma_wr.wr;
	cmd->pi_reg_wr.mr = mr; /* BUG: rdma-rkey-reuse -- the command's PI MR is registered for every I/O under the same key */
	cmd->pi_reg_wr.key = mr->rkey;
	cmd->pi_reg_wr.access = access; /* OK: rdma-access-flags-invalid -- LOCAL_WRITE is always set */

	cmd->pi_sge.addr = mr->iova;
	cmd->pi_sge.length = mr->length;
	cmd->pi_sge.lkey = mr->lkey;
	memset(&cmd->pi_rdma_wr, 0, sizeof(cmd->pi_rdma_wr));
	cmd->pi_rdma_wr.wr.opcode = cmd->dir == DMA_FROM_DEVICE ?
				    IB_WR_RDMA_READ : IB_WR_RDMA_WRITE;
	cmd->pi_rdma_wr.wr.sg_list = &cmd->pi_sge;
	cmd->pi_rdma_wr.wr.num_sge = 1;
	cmd->pi_rdma_wr.remote_addr = cmd->pi_va;
	cmd->pi_rdma_wr.rkey = cmd->pi_stag;
	return 0;
}

static int kc_isert_inv_pi(struct kc_isert_conn *conn, struct kc_isert_cmd *cmd)
{
	memset(&cmd->pi_inv_wr, 0, sizeof(cmd->pi_inv_wr));
	cmd->pi_inv_cqe.done = kc_isert_pi_inv_done;
	cmd->pi_inv_wr.wr_cqe = &cmd->pi_inv_cqe;
	cmd->pi_inv_wr.opcode = IB_WR_LOCAL_INV;
	cmd->pi_inv_wr.send_flags = IB_SEND_SIGNALED;
	cmd->pi_inv_wr.ex.invalidate_rkey = cmd->pi_mr->rkey;
	return ib_post_send(conn->qp, &cmd->pi_inv_wr, NULL);
}

static void kc_isert_pi_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_isert_cmd *cmd =
		container_of(wc->wr_cqe, struct kc_isert_cmd, pi_inv_cqe);
	struct kc_isert_conn *conn = cmd->conn;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("PI LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		/* state unknown: drop the MR, kc_isert_pi_mr() makes a new one */
		/* BUG: rdma-registration-in-datapath -- ib_dereg_mr() from a softirq completion handler; recovery belongs in a work item */
		ib_dereg_mr(cmd->pi_mr); /* BUG: rdma-local-mr-management -- ULP-managed PI MR deregistered by hand */
		cmd->pi_mr = NULL;
	}
	ib_dma_unmap_sg(conn->ibdev, cmd->pi_sg, cmd->pi_nents, cmd->dir); /* OK: rdma-unmap-before-invalidate -- runs from the LOCAL_INV completion */

	if (cmd->dir == DMA_FROM_DEVICE)
		kc_isert_execute_cmd(cmd);	/* PI verified by the core */
	else
		kc_isert_put_cmd(conn, cmd);
}

static void kc_isert_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_isert_cmd *cmd =
		container_of(wc->wr_cqe, struct kc_isert_cmd, rw_cqe);
	struct kc_isert_conn *conn = cmd->conn;

	/* OK: rdma-invalidation-leak -- rdma_rw owns the data MRs; an iWARP sink died with READ_WITH_INV */
	rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			    cmd->sg_cnt, DMA_FROM_DEVICE);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("Data-Out READ failed: %s\n", ib_wc_status_msg(wc->status));
		if (cmd->pi)
			/* BUG: rdma-invalidation-leak -- the PI sink registered with REMOTE_WRITE (iWARP) is unmapped and recycled without LOCAL_INV */
			ib_dma_unmap_sg(conn->ibdev, cmd->pi_sg, cmd->pi_nents,
					DMA_FROM_DEVICE);
		kc_isert_put_cmd(conn, cmd);
		return;
	}

	if (cmd->pi) {
		if (kc_isert_inv_pi(conn, cmd))
			pr_err("PI LOCAL_INV post failed, waiting for flush\n");
		return;
	}
	kc_isert_execute_cmd(cmd);
}

static void kc_isert_small_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_isert_cmd *cmd =
		container_of(wc->wr_cqe, struct kc_isert_cmd, rw_cqe);

	ib_dma_unmap_sg(cmd->conn->ibdev, cmd->sg, 1, DMA_FROM_DEVICE);
	if (wc->status == IB_WC_SUCCESS)
		kc_isert_execute_cmd(cmd);
	else
		kc_isert_put_cmd(cmd->conn, cmd);
}

/* One-page Data-Out: a single RDMA READ, skipping the rdma_rw context. */
static int kc_isert_pull_small(struct kc_isert_conn *conn,
			       struct kc_isert_cmd *cmd)
{
	struct ib_rdma_wr rd = {};
	struct ib_sge sge;

	if (ib_dma_map_sg(conn->ibdev, cmd->sg, 1, DMA_FROM_DEVICE) != 1)
		return -EIO;
	sge.addr = sg_dma_address(cmd->sg);
	sge.length = sg_dma_len(cmd->sg);
	sge.lkey = conn->pd->local_dma_lkey;

	cmd->rw_cqe.done = kc_isert_small_read_done;
	rd.wr.opcode = IB_WR_RDMA_READ; /* BUG: rdma-access-flags-transport -- READ sink addressed with local_dma_lkey; an iWARP READ response needs a sink with REMOTE_WRITE */
	rd.wr.wr_cqe = &cmd->rw_cqe;
	rd.wr.sg_list = &sge;
	rd.wr.num_sge = 1;
	rd.wr.send_flags = IB_SEND_SIGNALED;
	rd.remote_addr = cmd->remote_va;
	rd.rkey = cmd->remote_stag;
	return ib_post_send(conn->qp, &rd.wr, NULL);
}

int kc_isert_get_dataout(struct kc_isert_conn *conn, struct kc_isert_cmd *cmd)
{
	struct ib_send_wr *chain = NULL;
	int ret;

	cmd->dir = DMA_FROM_DEVICE;
	if (cmd->sg_cnt == 1 && !cmd->pi)
		return kc_isert_pull_small(conn, cmd);

	/* OK: rdma-local-mr-management, rdma-access-flags-transport -- rdma_rw builds the READ and registers an iWARP sink itself */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			       cmd->sg_cnt, 0, cmd->remote_va, cmd->remote_stag,
			       DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;

	cmd->rw_cqe.done = kc_isert_rdma_read_done;
	if (cmd->pi) {
		ret = kc_isert_reg_pi(conn, cmd);
		if (ret)
			goto out_destroy;
		cmd->pi_rdma_wr.wr.wr_cqe = &cmd->rw_cqe;
		cmd->pi_rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
		chain = &cmd->pi_reg_wr.wr;
	}

	ret = rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->port_num,
			       chain ? NULL : &cmd->rw_cqe, chain);
	if (ret) {
		if (cmd->pi)
			/* OK: rdma-invalidation-leak -- the chain with the PI REG_MR was refused as a whole */
			ib_dma_unmap_sg(conn->ibdev, cmd->pi_sg, cmd->pi_nents,
					DMA_FROM_DEVICE);
		goto out_destroy;
	}
	return 0;

out_destroy:
	rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			    cmd->sg_cnt, DMA_FROM_DEVICE);
	return ret;
}

static void kc_isert_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_isert_cmd *cmd =
		container_of(wc->wr_cqe, struct kc_isert_cmd, tx_cqe);
	struct kc_isert_conn *conn = cmd->conn;

	if (cmd->dir == DMA_TO_DEVICE)
		/* OK: rdma-invalidation-leak -- rdma_rw owns (and lazily invalidates) the data MRs */
		rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num,
				    cmd->sg, cmd->sg_cnt, DMA_TO_DEVICE);
	if (cmd->pi && cmd->dir == DMA_TO_DEVICE) {
		if (kc_isert_inv_pi(conn, cmd))
			pr_err("PI LOCAL_INV post failed, waiting for flush\n");
		return;		/* kc_isert_pi_inv_done() recycles it */
	}
	kc_isert_put_cmd(conn, cmd);
}

int kc_isert_put_datain(struct kc_isert_conn *conn, struct kc_isert_cmd *cmd)
{
	struct ib_send_wr *chain = &cmd->tx_wr;
	int ret;

	cmd->dir = DMA_TO_DEVICE;
	/* OK: rdma-local-mr-management -- the data itself goes through rdma_rw */
	ret = rdma_rw_ctx_init(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			       cmd->sg_cnt, 0, cmd->remote_va, cmd->remote_stag,
			       DMA_TO_DEVICE);
	if (ret < 0)
		return ret;

	cmd->tx_sge.addr = cmd->tx_dma;
	cmd->tx_sge.length = KC_ISERT_HDR_LEN;
	cmd->tx_sge.lkey = conn->pd->local_dma_lkey;
	memset(&cmd->tx_wr, 0, sizeof(cmd->tx_wr));
	cmd->tx_cqe.done = kc_isert_send_done;
	cmd->tx_wr.wr_cqe = &cmd->tx_cqe;
	cmd->tx_wr.sg_list = &cmd->tx_sge;
	cmd->tx_wr.num_sge = 1;
	cmd->tx_wr.opcode = IB_WR_SEND;
	cmd->tx_wr.send_flags = IB_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- the response SEND is always signaled */

	if (cmd->pi) {
		ret = kc_isert_reg_pi(conn, cmd);
		if (ret)
			goto out_destroy;
		cmd->pi_rdma_wr.wr.next = &cmd->tx_wr;
		chain = &cmd->pi_reg_wr.wr;
	}

	ret = rdma_rw_ctx_post(&cmd->rw, conn->qp, conn->port_num, NULL, chain);
	if (ret) {
		if (cmd->pi)
			/* OK: rdma-invalidation-leak -- nothing of the chain was posted */
			ib_dma_unmap_sg(conn->ibdev, cmd->pi_sg, cmd->pi_nents,
					DMA_TO_DEVICE);
		goto out_destroy;
	}
	return 0;

out_destroy:
	rdma_rw_ctx_destroy(&cmd->rw, conn->qp, conn->port_num, cmd->sg,
			    cmd->sg_cnt, DMA_TO_DEVICE);
	return ret;
}

void kc_isert_teardown(struct kc_isert_conn *conn)
{
	ib_drain_qp(conn->qp);
	kc_isert_free_cmds(conn, conn->cmds_max);
	rdma_destroy_qp(conn->cm_id);
}

MODULE_LICENSE("GPL");
