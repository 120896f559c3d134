/*
 * ckps: the sink of a training-checkpoint service, on librdmacm.  A
 * trainer connects once per checkpoint shard; the sink allocates a shard
 * buffer, registers it for remote write (rdma_reg_write) and returns its
 * address and rkey in the accept's private data.  The trainer RDMA-WRITEs
 * the shard and sends DONE; the sink persists it and acknowledges with a
 * small inline SEND.  A trainer whose shard outgrew the buffer sends GROW
 * first: the sink moves the shard to a larger buffer and answers with the
 * new (va, rkey).  BYE ends the session.
 *
 * Correct: GROW deregisters the old buffer before freeing it and replaces
 * the handle only then (a rare control event, not per I/O); the receive
 * failure path of the accept unwinds everything.
 *
 * Not correct: when rdma_create_qp() fails the accept path jumps past the
 * deregistration of the control-message MR; the session teardown frees the
 * shard buffer before deregistering it, so for a moment the trainer's key
 * (and any peer on the shared PD that learned it) reaches freed heap
 * memory; the QP asks for 256 bytes of inline data without ever looking at
 * what was granted.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CKPS_INLINE	256
#define CKPS_QDEPTH	8

enum { CKPS_DONE = 1, CKPS_GROW = 2, CKPS_BYE = 3, CKPS_ACK = 4, CKPS_MOVED = 5 };

struct ckps_hello {
	uint64_t va;
	uint32_t rkey;
	uint32_t len;
};

struct ckps_msg {
	uint32_t type;
	uint32_t shard;
	uint64_t len;
	uint64_t va;
	uint32_t rkey;
	uint32_t rsvd;
};

struct ckps_sess {
	struct rdma_cm_id *id;
	char              *shard;
	size_t             shard_len;
	struct ibv_mr     *shard_mr;
	struct ckps_msg   *ctl;		/* ctl[0]: receive, ctl[1]: send */
	struct ibv_mr     *ctl_mr;
	uint32_t           shard_no;
	int              (*persist)(uint32_t shard, const void *buf, size_t len);
};

int ckps_accept(struct rdma_cm_id *id, uint32_t shard_no, size_t len,
		int (*persist)(uint32_t, const void *, size_t),
		struct ckps_sess **out)
{
	struct ibv_qp_init_attr qa;
	struct rdma_conn_param cp;
	struct ckps_hello hello;
	struct ckps_sess *s;
	int ret = -ENOMEM;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->id = id;
	s->shard_no = shard_no;
	s->persist = persist;
	s->shard_len = len;
	s->shard = malloc(len);
	if (!s->shard)
		goto err_sess;
	s->shard_mr = rdma_reg_write(id, s->shard, len); // BUG: rdma-local-mr-management -- the shard's rkey goes to the trainer
	if (!s->shard_mr)
		goto err_shard;
	s->ctl = calloc(2, sizeof(*s->ctl));
	if (!s->ctl)
		goto err_shard_mr;
	s->ctl_mr = rdma_reg_msgs(id, s->ctl, 2 * sizeof(*s->ctl));
	if (!s->ctl_mr)
		goto err_ctl;

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 1;
	qa.cap.max_send_wr = CKPS_QDEPTH;
	qa.cap.max_recv_wr = CKPS_QDEPTH;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = CKPS_INLINE; // BUG: rdma-queue-cap-unchecked -- 256 inline bytes requested, the granted value is never read back
	if (rdma_create_qp(id, NULL, &qa)) {
		ret = -errno;
		goto err_shard_mr; // BUG: rdma-mr-leak -- skips rdma_dereg_mr(s->ctl_mr); the session holding it is freed below
	}
	if (rdma_post_recv(id, &s->ctl[0], &s->ctl[0], sizeof(s->ctl[0]), s->ctl_mr)) {
		ret = -errno;
		goto err_qp; // OK: rdma-mr-leak -- this path unwinds both MRs
	}

	hello.va = htobe64((uintptr_t)s->shard);
	hello.rkey = htobe32(s->shard_mr->rkey);
	hello.len = htobe32((uint32_t)len);
	memset(&cp, 0, sizeof(cp));
	cp.private_data = &hello;
	cp.private_data_len = sizeof(hello);
	cp.responder_resources = 1;
	if (rdma_accept(id, &cp)) {
		ret = -errno;
		goto err_qp;
	}
	*out = s;
	return 0;

err_qp:
	rdma_destroy_qp(id);
	rdma_dereg_mr(s->ctl_mr);
err_ctl:
	free(s->ctl);
err_shard_mr:
	rdma_dereg_mr(s->shard_mr);
err_shard:
	free(s->shard);
err_sess:
	free(s);
	return ret;
}

static int ckps_reply(struct ckps_sess *s, uint32_t type)
{
	s->ctl[1].type = htobe32(type);
	s->ctl[1].shard = htobe32(s->shard_no);
	s->ctl[1].len = htobe64(s->shard_len);
	s->ctl[1].va = htobe64((uintptr_t)s->shard);
	s->ctl[1].rkey = htobe32(s->shard_mr->rkey);
	return rdma_post_send(s->id, &s->ctl[1], &s->ctl[1], sizeof(s->ctl[1]),
			      NULL, IBV_SEND_INLINE);
}

static int ckps_grow(struct ckps_sess *s, size_t newlen)
{
	struct ibv_mr *nmr;
	char *nbuf;

	nbuf = malloc(newlen);
	if (!nbuf)
		return -ENOMEM;
	/* OK: rdma-registration-in-datapath -- a shard grows at most a few times per checkpoint, not per transfer */
	nmr = rdma_reg_write(s->id, nbuf, newlen); // BUG: rdma-local-mr-management -- the new shard's rkey goes to the trainer
	if (!nmr) {
		free(nbuf);
		return -ENOMEM;
	}
	rdma_dereg_mr(s->shard_mr);
	free(s->shard); // OK: rdma-invalidation-leak -- the old MR was deregistered (its key is dead) before its memory is freed
	s->shard = nbuf;
	s->shard_mr = nmr; // OK: rdma-mr-leak -- the previous MR was deregistered above
	s->shard_len = newlen;
	return ckps_reply(s, CKPS_MOVED);
}

/* returns 1 when the session is over */
static int ckps_handle(struct ckps_sess *s, const struct ckps_msg *m)
{
	switch (be32toh(m->type)) {
	case CKPS_DONE:
		if (s->persist(s->shard_no, s->shard, be64toh(m->len)))
			return -EIO;
		return ckps_reply(s, CKPS_ACK);
	case CKPS_GROW:
		return ckps_grow(s, be64toh(m->len));
	case CKPS_BYE:
		return 1;
	default:
		return -EPROTO;
	}
}

int ckps_poll(struct ckps_sess *s)
{
	struct ibv_wc wc;
	int ret;

	ret = rdma_get_recv_comp(s->id, &wc);
	if (ret <= 0)
		return -EIO;
	if (wc.status != IBV_WC_SUCCESS)
		return -EIO;
	ret = ckps_handle(s, &s->ctl[0]);
	if (ret)
		return ret;
	if (rdma_post_recv(s->id, &s->ctl[0], &s->ctl[0], sizeof(s->ctl[0]), s->ctl_mr))
		return -EIO;
	/* reap the ACK / MOVED send */
	if (rdma_get_send_comp(s->id, &wc) <= 0)
		return -EIO;
	return 0;
}

void ckps_session_free(struct ckps_sess *s)
{
	rdma_disconnect(s->id);
	rdma_destroy_qp(s->id);
	rdma_dereg_mr(s->ctl_mr);
	free(s->ctl);
	/* release in allocation order */
	free(s->shard); // BUG: rdma-invalidation-leak -- the shard is freed while its MR (key held by the trainer) is still registered
	rdma_dereg_mr(s->shard_mr);
	rdma_destroy_id(s->id);
	free(s);
}
