/*
 * blobc: client of a blob store, on the extended verbs API (ibv_create_cq_ex
 * polled with ibv_start_poll/ibv_next_poll, ibv_create_qp_ex posted with
 * ibv_wr_*).  Every request slot owns a type-2 window over its slice of
 * the client's cache arena.  GET binds the window REMOTE_WRITE (the server
 * RDMA-WRITEs the blob), PUT binds it REMOTE_READ (the server RDMA-READs
 * the value); the bind and the request SEND go out in one batch.  The
 * server answers with SEND_WITH_INV on the window's key; without it, the
 * client posts a signaled LOCAL_INV and finishes the slot from its
 * completion.
 *
 * Correct: a new key per bind; the PUT completion compares the
 * invalidated key with the slot's before skipping the LOCAL_INV.
 *
 * Not correct: the GET completion takes IBV_WC_WITH_INV as "my window is
 * dead" without looking at which key the server invalidated; the send
 * queue reserves two entries per slot (bind + request) and forgets the
 * LOCAL_INV the completion path may post -- a hand-made factor that is
 * also too small.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOBC_SLOT_SIZE	(64 * 1024)
#define BLOBC_INV_TAG	(1ULL << 63)

enum { BLOBC_GET = 1, BLOBC_PUT = 2 };

struct blobc_hdr {
	uint8_t  op;
	uint8_t  name_len;
	uint16_t slot;
	uint32_t rkey;
	uint64_t va;
	uint32_t len;
	char     name[44];
};

struct blobc_rsp {
	uint16_t slot;
	uint16_t status;
	uint32_t len;
};

struct blobc_req {
	uint16_t          slot;
	uint8_t           op;
	bool              busy;
	struct ibv_mw    *mw;
	uint32_t          key;
	char             *data;
	struct blobc_hdr  hdr;
	int               rsp_status;
	uint32_t          rsp_len;
	void            (*cb)(void *arg, int status, uint32_t len);
	void             *arg;
};

struct blobc {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq_ex   *cqx;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	struct ibv_mr      *arena_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr      *hdr_mr;	/* covers reqs[] */
	struct ibv_mr      *rsp_mr;
	char               *arena;
	struct blobc_rsp   *rsps;
	struct blobc_req   *reqs;
	unsigned int        depth;
};

int blobc_create_queues(struct blobc *b)
{
	struct ibv_cq_init_attr_ex ca;
	struct ibv_qp_init_attr_ex qa;

	memset(&ca, 0, sizeof(ca));
	ca.cqe = 4 * b->depth;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS;
	b->cqx = ibv_create_cq_ex(b->ctx, &ca);
	if (!b->cqx)
		return -errno;

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = ibv_cq_ex_to_cq(b->cqx);
	qa.recv_cq = ibv_cq_ex_to_cq(b->cqx);
	qa.pd = b->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			    IBV_QP_EX_WITH_LOCAL_INV;
	/* two WRs per request: the bind and the request itself */
	// BUG(file): rdma-send-queue-undersized -- a slot posts BIND_MW + SEND and, without remote invalidation, a LOCAL_INV: 3 per slot, 2 reserved
	qa.cap.max_send_wr = 2 * b->depth + 1; // BUG: rdma-send-queue-manual-factor -- depth times a hand-made factor in a file that posts BIND_MW and LOCAL_INV
	qa.cap.max_recv_wr = b->depth;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	b->qp = ibv_create_qp_ex(b->ctx, &qa);
	if (!b->qp) {
		ibv_destroy_cq(ibv_cq_ex_to_cq(b->cqx));
		return -errno;
	}
	b->qpx = ibv_qp_to_qp_ex(b->qp);
	return 0;
}

static struct blobc_req *blobc_get_slot(struct blobc *b)
{
	unsigned int i;

	for (i = 0; i < b->depth; i++)
		if (!b->reqs[i].busy) {
			b->reqs[i].busy = true;
			return &b->reqs[i];
		}
	return NULL;
}

static int blobc_submit(struct blobc *b, uint8_t op, const char *name, uint32_t len,
			void (*cb)(void *, int, uint32_t), void *arg)
{
	struct ibv_mw_bind_info bi;
	struct blobc_req *r;
	size_t nl = strlen(name);

	if (len > BLOBC_SLOT_SIZE || nl > sizeof(r->hdr.name))
		return -EINVAL;
	r = blobc_get_slot(b);
	if (!r)
		return -EAGAIN;
	r->op = op;
	r->cb = cb;
	r->arg = arg;
	r->key = ibv_inc_rkey(r->key);

	bi.mr = b->arena_mr;
	bi.addr = (uintptr_t)r->data;
	bi.length = len;
	bi.mw_access_flags = op == BLOBC_GET ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;

	r->hdr.op = op;
	r->hdr.name_len = (uint8_t)nl;
	r->hdr.slot = htobe16(r->slot);
	r->hdr.rkey = htobe32(r->key);
	r->hdr.va = htobe64((uintptr_t)r->data);
	r->hdr.len = htobe32(len);
	memcpy(r->hdr.name, name, nl);

	ibv_wr_start(b->qpx);
	b->qpx->wr_id = r->slot;
	b->qpx->wr_flags = 0;
	ibv_wr_bind_mw(b->qpx, r->mw, r->key, &bi); // BUG: rdma-local-mr-management -- per-request window bind done by the ULP
	b->qpx->wr_id = r->slot;
	b->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(b->qpx);
	ibv_wr_set_sge(b->qpx, b->hdr_mr->lkey, (uintptr_t)&r->hdr, sizeof(r->hdr));
	if (ibv_wr_complete(b->qpx)) {
		r->busy = false;
		return -EIO;
	}
	return 0;
}

int blobc_get(struct blobc *b, const char *name, uint32_t len,
	      void (*cb)(void *, int, uint32_t), void *arg)
{
	return blobc_submit(b, BLOBC_GET, name, len, cb, arg);
}

int blobc_put(struct blobc *b, const char *name, const void *val, uint32_t len,
	      void (*cb)(void *, int, uint32_t), void *arg)
{
	int ret;

	ret = blobc_submit(b, BLOBC_PUT, name, len, cb, arg);
	(void)val;	/* the caller wrote the value into the slot's data already */
	return ret;
}

static void blobc_finish(struct blobc_req *r, int status, uint32_t len)
{
	r->cb(r->arg, status, len);
	r->busy = false;
}

static int blobc_local_inv(struct blobc *b, struct blobc_req *r)
{
	ibv_wr_start(b->qpx);
	b->qpx->wr_id = BLOBC_INV_TAG | r->slot;
	b->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(b->qpx, r->key);
	return ibv_wr_complete(b->qpx);
}

static void blobc_get_rsp(struct blobc *b, struct blobc_req *r, const struct blobc_rsp *rsp)
{
	/* the server always invalidates after writing the blob */
	if (ibv_wc_read_wc_flags(b->cqx) & IBV_WC_WITH_INV) { // BUG: rdma-remote-invalidate-unchecked -- any invalidated key is taken as this slot's
		blobc_finish(r, be16toh(rsp->status) ? -EIO : 0, be32toh(rsp->len));
		return;
	}
	r->rsp_status = be16toh(rsp->status) ? -EIO : 0;
	r->rsp_len = be32toh(rsp->len);
	if (blobc_local_inv(b, r))
		r->cb(r->arg, -EIO, 0);		/* slot stays busy until reset */
}

static void blobc_put_rsp(struct blobc *b, struct blobc_req *r, const struct blobc_rsp *rsp)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated key is compared with the slot's */
	if ((ibv_wc_read_wc_flags(b->cqx) & IBV_WC_WITH_INV) &&
	    ibv_wc_read_invalidated_rkey(b->cqx) == r->key) {
		blobc_finish(r, be16toh(rsp->status) ? -EIO : 0, 0);
		return;
	}
	r->rsp_status = be16toh(rsp->status) ? -EIO : 0;
	r->rsp_len = 0;
	if (blobc_local_inv(b, r))
		r->cb(r->arg, -EIO, 0);
}

static int blobc_post_recv(struct blobc *b, uint64_t i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&b->rsps[i],
		.length = sizeof(b->rsps[i]),
		.lkey = b->rsp_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(b->qp, &wr, &bad);
}

int blobc_poll(struct blobc *b)
{
	struct ibv_poll_cq_attr pa = { 0 };
	int n = 0, ret;

	ret = ibv_start_poll(b->cqx, &pa);
	if (ret)
		return ret == ENOENT ? 0 : -EIO;
	do {
		uint64_t id = b->cqx->wr_id;
		enum ibv_wc_opcode op = ibv_wc_read_opcode(b->cqx);

		n++;
		if (b->cqx->status != IBV_WC_SUCCESS)
			continue;	/* the QP is in error; reset tears the slots down */
		if (op == IBV_WC_RECV) {
			struct blobc_rsp *rsp = &b->rsps[id];
			uint16_t slot = be16toh(rsp->slot);
			struct blobc_req *r;

			if (slot < b->depth) {
				r = &b->reqs[slot];
				if (r->op == BLOBC_GET)
					blobc_get_rsp(b, r, rsp);
				else
					blobc_put_rsp(b, r, rsp);
			}
			blobc_post_recv(b, id);
		} else if (op == IBV_WC_LOCAL_INV && (id & BLOBC_INV_TAG)) {
			struct blobc_req *r = &b->reqs[id & 0xffff];

			blobc_finish(r, r->rsp_status, r->rsp_len);
		}
	} while (ibv_next_poll(b->cqx) == 0);
	ibv_end_poll(b->cqx);
	return n;
}
