// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * isertx: data movement of an iSER target before the rdma_rw conversion, in
 * the shape of drivers/infiniband/ulp/isert/ib_isert.c of the Linux 4.4/4.5
 * era (isert_create_qp, isert_inv_rkey, isert_fast_reg_mr, isert_reg_rdma,
 * isert_unreg_rdma). Written fresh for the held-out batch; "IB/isert: convert
 * to the generic RDMA READ/WRITE API" (Christoph Hellwig, 2016) replaced all
 * of it with rdma_rw contexts.
 *
 * For every command with data the target fast-registers its own buffer (a
 * LOCAL_INV is chained in front when the descriptor's key was used before,
 * bumping the key), then RDMA READs the initiator's data into it (WRITE
 * commands) or RDMA WRITEs from it (READ commands), and finally SENDs the
 * iSCSI response. The registration is local only: the key never leaves the
 * target, so descriptors go back to the pool without invalidation, and the
 * next use invalidates and re-keys them.
 *
 * Defects:
 *  - the send queue holds one entry per command (ISERT_QP_MAX_REQ_DTOS is
 *    commands + misc PDUs), but a command keeps LOCAL_INV, REG_MR, the RDMA
 *    work request and the response SEND on it;
 *  - the RDMA READ sink is registered with IB_ACCESS_LOCAL_WRITE only; on
 *    iWARP a READ response is a tagged placement that needs REMOTE_WRITE on
 *    the sink (what rdma_rw later did for it).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define ISCSI_DEF_XMIT_CMDS_MAX	128
#define ISERT_MAX_TX_MISC_PDUS	4
#define ISERT_MAX_RX_MISC_PDUS	6
#define ISERT_QP_MAX_REQ_DTOS	(ISCSI_DEF_XMIT_CMDS_MAX +	\
				 ISERT_MAX_TX_MISC_PDUS +	\
				 ISERT_MAX_RX_MISC_PDUS)
#define ISERT_QP_MAX_RECV_DTOS	(ISCSI_DEF_XMIT_CMDS_MAX)
#define ISCSI_ISER_SG_TABLESIZE	256

enum isertx_indicator {
	ISERT_DATA_KEY_VALID = 1 << 0,
};

struct isertx_fr_desc {
	struct list_head	list;
	struct ib_mr		*data_mr;
	u8			ind;
};

struct isertx_device {
	struct ib_device	*ib_device;
	struct ib_pd		*pd;
};

struct isertx_conn {
	struct rdma_cm_id	*cm_id;
	struct isertx_device	*device;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	spinlock_t		pool_lock;
	struct list_head	fr_pool;
	int			fr_pool_size;
};

struct isertx_data_buf {
	struct scatterlist	*sg;
	int			nents;
	enum dma_data_direction	dma_dir;
};

struct isertx_cmd {
	struct isertx_conn	*conn;
	struct isertx_fr_desc	*fr_desc;
	struct isertx_data_buf	data;
	bool			write_cmd;	/* initiator sends data: RDMA READ */
	u64			remote_va;
	u32			remote_rkey;
	struct ib_sge		ib_sge;
	struct ib_rdma_wr	rdma_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		rsp_sge;
	struct ib_cqe		rdma_cqe;
	struct ib_cqe		send_cqe;
};

void isertx_put_cmd(struct isertx_cmd *cmd);
void isertx_execute_cmd(struct isertx_cmd *cmd);

/**
 * isertx_create_qp - create the connection's queue pair
 * @isert_conn: the connection
 */
int isertx_create_qp(struct isertx_conn *isert_conn)
{
	struct isertx_device *device = isert_conn->device;
	struct ib_qp_init_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.event_handler = NULL;
	attr.qp_context = isert_conn;
	attr.send_cq = isert_conn->cq;
	attr.recv_cq = isert_conn->cq;
	/* BUG: rdma-send-queue-undersized -- one entry per command (+ misc PDUs), but a command keeps LOCAL_INV, REG_MR, its RDMA READ/WRITE and the response SEND on the queue */
	attr.cap.max_send_wr = ISERT_QP_MAX_REQ_DTOS + 1;
	attr.cap.max_recv_wr = ISERT_QP_MAX_RECV_DTOS + 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(isert_conn->cm_id, device->pd, &attr);
	if (ret) {
		pr_err("rdma_create_qp failed for cma_id %d\n", ret);
		return ret;
	}
	isert_conn->qp = isert_conn->cm_id->qp;
	return 0;
}

void isertx_conn_terminate(struct isertx_conn *isert_conn)
{
	struct isertx_fr_desc *desc, *tmp;

	rdma_disconnect(isert_conn->cm_id);
	ib_drain_qp(isert_conn->qp);
	list_for_each_entry_safe(desc, tmp, &isert_conn->fr_pool, list) {
		list_del(&desc->list);
		ib_dereg_mr(desc->data_mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		kfree(desc);
	}
}

/**
 * isertx_conn_create_fastreg_pool - one descriptor per command, at login
 * @isert_conn: the connection
 */
int isertx_conn_create_fastreg_pool(struct isertx_conn *isert_conn)
{
	struct isertx_fr_desc *fr_desc, *tmp;
	int i;

	INIT_LIST_HEAD(&isert_conn->fr_pool);
	isert_conn->fr_pool_size = 0;
	for (i = 0; i < ISCSI_DEF_XMIT_CMDS_MAX; i++) {
		fr_desc = kzalloc(sizeof(*fr_desc), GFP_KERNEL);
		if (!fr_desc)
			goto err;
		/* BUG: rdma-local-mr-management -- the ULP allocates its own fast-registration MRs */
		fr_desc->data_mr = ib_alloc_mr(isert_conn->device->pd,
					       IB_MR_TYPE_MEM_REG,
					       ISCSI_ISER_SG_TABLESIZE);
		if (IS_ERR(fr_desc->data_mr)) {
			kfree(fr_desc);
			goto err;
		}
		fr_desc->ind |= ISERT_DATA_KEY_VALID;
		list_add_tail(&fr_desc->list, &isert_conn->fr_pool);
		isert_conn->fr_pool_size++;
	}
	return 0;

err:
	list_for_each_entry_safe(fr_desc, tmp, &isert_conn->fr_pool, list) {
		list_del(&fr_desc->list);
		ib_dereg_mr(fr_desc->data_mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		kfree(fr_desc);
	}
	return -ENOMEM;
}

static void isertx_inv_rkey(struct ib_send_wr *inv_wr, struct ib_mr *mr)
{
	u32 rkey;

	memset(inv_wr, 0, sizeof(*inv_wr));
	inv_wr->opcode = IB_WR_LOCAL_INV;
	inv_wr->ex.invalidate_rkey = mr->rkey;

	/* Bump the key */
	rkey = ib_inc_rkey(mr->rkey);
	ib_update_fast_reg_key(mr, rkey);
}

static int isertx_fast_reg_mr(struct isertx_conn *isert_conn,
			      struct isertx_fr_desc *fr_desc,
			      struct isertx_data_buf *mem,
			      struct ib_sge *sge)
{
	struct ib_mr *mr = fr_desc->data_mr;
	struct ib_reg_wr reg_wr;
	struct ib_send_wr inv_wr, *wr = NULL;
	int ret, n;

	if (!(fr_desc->ind & ISERT_DATA_KEY_VALID)) {
		isertx_inv_rkey(&inv_wr, mr);
		wr = &inv_wr;
	}

	/* BUG: rdma-local-mr-management -- the ULP maps the pages into its MR itself */
	n = ib_map_mr_sg(mr, mem->sg, mem->nents, NULL, PAGE_SIZE);
	if (unlikely(n != mem->nents)) {
		pr_err("failed to map mr sg (%d/%d)\n", n, mem->nents);
		return n < 0 ? n : -EINVAL;
	}

	memset(&reg_wr, 0, sizeof(reg_wr));
	reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	/* OK: rdma-rkey-reuse -- a descriptor used before always gets the chained LOCAL_INV, and isertx_inv_rkey() bumps its key; only a never-used MR keeps its first key */
	reg_wr.mr = mr;
	reg_wr.key = mr->lkey;
	reg_wr.access = IB_ACCESS_LOCAL_WRITE;

	if (!wr)
		wr = &reg_wr.wr;
	else
		wr->next = &reg_wr.wr;

	ret = ib_post_send(isert_conn->qp, wr, NULL);
	if (ret) {
		pr_err("fast registration failed, ret:%d\n", ret);
		return ret;
	}
	fr_desc->ind &= ~ISERT_DATA_KEY_VALID;

	sge->lkey = mr->lkey;
	sge->addr = mr->iova;
	sge->length = mr->length;
	return 0;
}

static void isertx_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isertx_cmd *cmd =
		container_of(wc->wr_cqe, struct isertx_cmd, rdma_cqe);
	struct isertx_conn *isert_conn = cmd->conn;

	ib_dma_unmap_sg(isert_conn->device->ib_device, cmd->data.sg,
			cmd->data.nents, cmd->data.dma_dir);
	spin_lock(&isert_conn->pool_lock);
	/* OK: rdma-invalidation-leak -- the registration has LOCAL_WRITE only; its key never reached the initiator, and the next use invalidates it */
	list_add_tail(&cmd->fr_desc->list, &isert_conn->fr_pool);
	spin_unlock(&isert_conn->pool_lock);
	cmd->fr_desc = NULL;

	if (wc->status != IB_WC_SUCCESS) {
		isertx_put_cmd(cmd);
		return;
	}
	isertx_execute_cmd(cmd);
}

/**
 * isertx_get_dataout - pull a WRITE command's data from the initiator
 * @cmd: the command, data buffer mapped
 */
int isertx_get_dataout(struct isertx_cmd *cmd)
{
	struct isertx_conn *isert_conn = cmd->conn;
	int ret;

	spin_lock(&isert_conn->pool_lock);
	cmd->fr_desc = list_first_entry(&isert_conn->fr_pool,
					struct isertx_fr_desc, list);
	list_del(&cmd->fr_desc->list);
	spin_unlock(&isert_conn->pool_lock);

	ret = isertx_fast_reg_mr(isert_conn, cmd->fr_desc, &cmd->data,
				 &cmd->ib_sge);
	if (ret)
		goto err_put_desc;

	cmd->rdma_cqe.done = isertx_rdma_read_done;
	memset(&cmd->rdma_wr, 0, sizeof(cmd->rdma_wr));
	cmd->rdma_wr.wr.wr_cqe = &cmd->rdma_cqe;
	cmd->rdma_wr.wr.sg_list = &cmd->ib_sge;
	cmd->rdma_wr.wr.num_sge = 1;
	cmd->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmd->rdma_wr.remote_addr = cmd->remote_va;
	cmd->rdma_wr.rkey = cmd->remote_rkey;
	/* BUG: rdma-access-flags-transport -- RDMA READ into a sink registered with IB_ACCESS_LOCAL_WRITE only; on iWARP the READ response needs REMOTE_WRITE on it */
	cmd->rdma_wr.wr.opcode = IB_WR_RDMA_READ;

	ret = ib_post_send(isert_conn->qp, &cmd->rdma_wr.wr, NULL);
	if (ret) {
		pr_warn("ib_post_send() failed for IB_WR_RDMA_READ\n");
		goto err_put_desc;
	}
	return 0;

err_put_desc:
	spin_lock(&isert_conn->pool_lock);
	list_add_tail(&cmd->fr_desc->list, &isert_conn->fr_pool);
	spin_unlock(&isert_conn->pool_lock);
	cmd->fr_desc = NULL;
	return ret;
}

static void isertx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isertx_cmd *cmd =
		container_of(wc->wr_cqe, struct isertx_cmd, send_cqe);

	isertx_put_cmd(cmd);
}

/**
 * isertx_put_response - send the iSCSI response PDU of a command
 * @cmd: the command
 * @rsp_dma: DMA address of the response header
 * @len: its length
 */
int isertx_put_response(struct isertx_cmd *cmd, u64 rsp_dma, u32 len)
{
	struct isertx_conn *isert_conn = cmd->conn;

	cmd->rsp_sge.addr = rsp_dma;
	cmd->rsp_sge.length = len;
	cmd->rsp_sge.lkey = isert_conn->device->pd->local_dma_lkey;

	cmd->send_cqe.done = isertx_send_done;
	cmd->send_wr.next = NULL;
	cmd->send_wr.wr_cqe = &cmd->send_cqe;
	cmd->send_wr.sg_list = &cmd->rsp_sge;
	cmd->send_wr.num_sge = 1;
	cmd->send_wr.opcode = IB_WR_SEND;
	cmd->send_wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(isert_conn->qp, &cmd->send_wr, NULL);
}
