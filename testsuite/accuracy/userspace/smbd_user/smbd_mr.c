/*
 * smbd_mr.c: window list and registration helpers.
 *
 * Correct: every bind uses a new key (ibv_inc_rkey); deregistration posts a
 * signaled LOCAL_INV and polls for its completion before the window goes
 * back to the free list; smbd_check_remote_inv() compares the invalidated
 * key with the window's.
 */
#include "smbd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int smbd_mr_list_init(struct smbd_conn *c)
{
	unsigned int i;

	c->mrs = calloc(c->max_mrs, sizeof(*c->mrs));
	if (!c->mrs)
		return -ENOMEM;
	for (i = 0; i < c->max_mrs; i++) {
		c->mrs[i].mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!c->mrs[i].mw)
			goto undo;
		c->mrs[i].key = c->mrs[i].mw->rkey;
		c->mrs[i].next = c->free_mrs;
		c->free_mrs = &c->mrs[i];
	}
	return 0;
undo:
	while (i--)
		ibv_dealloc_mw(c->mrs[i].mw);
	free(c->mrs);
	c->mrs = NULL;
	c->free_mrs = NULL;
	return -ENOMEM;
}

static int smbd_wait(struct smbd_conn *c, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n && wc.wr_id == wr_id)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

struct smbd_mr *smbd_register_mr(struct smbd_conn *c, void *buf, uint32_t len, bool writable)
{
	struct smbd_mr *mr = c->free_mrs;
	struct ibv_send_wr wr, *bad;

	if (!mr)
		return NULL;
	c->free_mrs = mr->next;
	mr->buf = buf;
	mr->len = len;
	/* OK: rdma-rkey-reuse -- a fresh key for every registration */
	mr->key = ibv_inc_rkey(mr->key);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)mr;
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-I/O window bind done by the ULP
	wr.bind_mw.mw = mr->mw;
	wr.bind_mw.rkey = mr->key;
	wr.bind_mw.bind_info.mr = c->io_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)buf;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = writable ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	if (ibv_post_send(c->qp, &wr, &bad)) {
		mr->next = c->free_mrs;
		c->free_mrs = mr;
		return NULL;
	}
	mr->bound = true;
	return mr;
}

int smbd_deregister_mr(struct smbd_conn *c, struct smbd_mr *mr)
{
	struct ibv_send_wr wr, *bad;

	if (mr->bound) {
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = (uintptr_t)mr | 1;
		wr.opcode = IBV_WR_LOCAL_INV;
		wr.invalidate_rkey = mr->key;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (ibv_post_send(c->qp, &wr, &bad) || smbd_wait(c, (uintptr_t)mr | 1))
			return -EIO;	/* window stays bound and off the list */
		mr->bound = false;
	}
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- back on the list only after the LOCAL_INV completed */
	smbd_put_mr(c, mr);
	return 0;
}

void smbd_put_mr(struct smbd_conn *c, struct smbd_mr *mr)
{
	mr->next = c->free_mrs;
	c->free_mrs = mr;
}

bool smbd_check_remote_inv(const struct smbd_mr *mr, uint32_t rkey)
{
	return mr->bound && rkey == mr->key;
}
