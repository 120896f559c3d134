/*
 * iserx: an iSER-like initiator in userspace on the extended QP API.  Each
 * task binds a type-2 window over its data buffer with ibv_wr_bind_mw()
 * and sends the command PDU in the same batch; the target moves the data
 * and answers with SEND_WITH_INV.  Remote invalidation is verified by
 * iserx_check_remote_inv(), which compares the invalidated key with the
 * task's; otherwise (or on mismatch) a signaled LOCAL_INV is posted and
 * the initiator polls for its completion before the task's buffer is
 * handed back.
 *
 * Correct throughout for the registration checks: fresh key per bind,
 * checked invalidation, LOCAL_INV waited for, send queue sized from
 * iserx_sq_size() for BIND + SEND + LOCAL_INV.
 * Migration note: that size is depth times the ULP's own factor.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ISERX_WRS_PER_TASK	3	/* BIND_MW, SEND, LOCAL_INV */

struct iserx_pdu {
	uint8_t  opcode;
	uint8_t  flags;
	uint16_t rsvd;
	uint32_t itt;
	uint64_t va;
	uint32_t stag;
	uint32_t len;
	uint8_t  cdb[16];
};

struct iserx_task {
	uint32_t          itt;
	struct ibv_mw    *mw;
	uint32_t          stag;
	void             *buf;
	uint32_t          len;
	struct iserx_pdu  pdu;
	bool              busy;
};

struct iserx_conn {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	struct ibv_mr      *data_mr;
	struct ibv_mr      *pdu_mr;
	unsigned int        cmds_max;
	struct iserx_task  *tasks;
};

static unsigned int iserx_sq_size(unsigned int cmds_max)
{
	return cmds_max * ISERX_WRS_PER_TASK + 1;
}

int iserx_create_qp(struct iserx_conn *c)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.pd = c->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			      IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-undersized -- three WRs per task plus one */
	attr.cap.max_send_wr = iserx_sq_size(c->cmds_max); // BUG: rdma-send-queue-manual-factor -- cmds_max times the ULP's own factor (via iserx_sq_size)
	attr.cap.max_recv_wr = c->cmds_max;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp_ex(c->ctx, &attr);
	if (!c->qp)
		return -errno;
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	return 0;
}

int iserx_send_command(struct iserx_conn *c, struct iserx_task *t, bool is_read)
{
	struct ibv_mw_bind_info bi = {
		.mr = c->data_mr,
		.addr = (uintptr_t)t->buf,
		.length = t->len,
		.mw_access_flags = is_read ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ,
	};

	t->stag = ibv_inc_rkey(t->stag);
	t->pdu.itt = htobe32(t->itt);
	t->pdu.va = htobe64((uintptr_t)t->buf);
	t->pdu.stag = htobe32(t->stag);
	t->pdu.len = htobe32(t->len);
	t->busy = true;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = (uintptr_t)t;
	c->qpx->wr_flags = 0;
	/* OK: rdma-rkey-reuse -- the new key is ibv_inc_rkey() of the previous bind's key */
	ibv_wr_bind_mw(c->qpx, t->mw, t->stag, &bi); // BUG: rdma-local-mr-management -- per-task window bind done by the ULP
	c->qpx->wr_id = (uintptr_t)t;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(c->qpx);
	ibv_wr_set_sge(c->qpx, c->pdu_mr->lkey, (uintptr_t)&t->pdu, sizeof(t->pdu));
	return ibv_wr_complete(c->qpx);
}

static bool iserx_check_remote_inv(const struct iserx_task *t, uint32_t rkey)
{
	return rkey == t->stag;
}

static int iserx_inv_and_wait(struct iserx_conn *c, struct iserx_task *t)
{
	struct ibv_wc wc;
	int n;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = (uintptr_t)t | 1;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(c->qpx, t->stag);
	if (ibv_wr_complete(c->qpx))
		return -EIO;
	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != ((uintptr_t)t | 1)));
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

/* called for the response PDU of task t */
int iserx_task_rsp(struct iserx_conn *c, struct iserx_task *t, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- the key is passed to iserx_check_remote_inv(), which compares */
	if ((wc->wc_flags & IBV_WC_WITH_INV) &&
	    iserx_check_remote_inv(t, wc->invalidated_rkey)) {
		t->busy = false;
		return 0;
	}
	if (iserx_inv_and_wait(c, t))
		return -EIO;	/* task stays busy; connection teardown follows */
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the LOCAL_INV completion was polled above */
	t->busy = false;
	return 0;
}

int iserx_alloc_tasks(struct iserx_conn *c)
{
	unsigned int i;

	c->tasks = calloc(c->cmds_max, sizeof(*c->tasks));
	if (!c->tasks)
		return -ENOMEM;
	for (i = 0; i < c->cmds_max; i++) {
		c->tasks[i].itt = i;
		c->tasks[i].mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!c->tasks[i].mw) {
			while (i-- > 0)
				ibv_dealloc_mw(c->tasks[i].mw);
			free(c->tasks);
			c->tasks = NULL;
			return -ENOMEM;
		}
		c->tasks[i].stag = c->tasks[i].mw->rkey;
	}
	return 0;
}
