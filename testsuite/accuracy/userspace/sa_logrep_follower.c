/*
 * sa_logrep_follower.c - follower side of an RDMA log-replication protocol
 * (Raft-style leader/follower, one-sided appends).
 *
 * The follower owns its log as a set of 1 MiB segments.  Each segment is
 * registered LOCAL_WRITE | REMOTE_WRITE and granted to the current leader in
 * a CTL_SEG_GRANT message {addr, rkey}; the leader appends entries with
 * RDMA WRITE WITH IMM (imm = segment << 16 | entry count).  The leader also
 * RDMA-writes its commit index into a page whose key travels in the
 * rdma_accept() private data.  Compaction after a snapshot retires
 * segments: their MR is deregistered and the buffer kept for the next grant.
 * A higher-term leader may connect while the deposed one is still attached
 * and appending.
 *
 * Wrong: grant_segments() leaks the segment it was granting when the send
 * fails; a suffix truncated after a leader change is recycled with the
 * deposed leader's keys still valid; accept_leader() frees the commit page
 * after its key went out and returns with the MR still registered;
 * follower_destroy() frees the commit page before deregistering it.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked, rdma-remote-invalidate-unchecked -- not part of this review
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define SEG_BYTES	(1u << 20)
#define SEG_ENTRIES	4096
#define MAX_SEGS	32
#define CTL_DEPTH	16

#define LOG_ERR(fmt, ...) fprintf(stderr, "[follower] " fmt "\n", ##__VA_ARGS__)

enum ctl_type { CTL_SEG_GRANT = 1, CTL_SEG_REVOKE, CTL_APPEND_ACK };

struct ctl_msg {
	uint32_t type;
	uint32_t seg;
	uint64_t index;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct accept_pdata {
	uint64_t commit_addr;
	uint32_t commit_rkey;
	uint32_t term;
};

struct log_seg {
	uint64_t	 first_index;
	char		*buf;
	struct ibv_mr	*mr;
	int		 granted;
	struct log_seg	*next_free;
};

struct follower {
	struct rdma_event_channel *ec;
	struct rdma_cm_id	*leader;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct log_seg		 seg[MAX_SEGS];
	int			 nseg;
	struct log_seg		*seg_free;
	uint64_t		*commit;
	struct ibv_mr		*commit_mr;
	struct ctl_msg		*ctl;		/* CTL_DEPTH receive slots, then one send slot */
	struct ibv_mr		*ctl_mr;
	uint32_t		 term;
	uint64_t		 last_index;
};

static int seg_register(struct follower *f, struct log_seg *s)
{
	if (!s->buf && posix_memalign((void **)&s->buf, 4096, SEG_BYTES))
		return -ENOMEM;
	s->mr = ibv_reg_mr(f->pd, s->buf, SEG_BYTES,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr) {
		free(s->buf);
		s->buf = NULL;
		return -errno;
	}
	return 0;
}

static void seg_unregister(struct log_seg *s)
{
	ibv_dereg_mr(s->mr);
	s->mr = NULL;
	free(s->buf);		/* OK: rdma-invalidation-leak -- the MR is deregistered before the buffer goes */
	s->buf = NULL;
	s->granted = 0;
}

static int ctl_send(struct follower *f, const struct ctl_msg *m)
{
	struct ctl_msg *tx = &f->ctl[CTL_DEPTH];
	struct ibv_sge sge = {
		.addr = (uintptr_t)tx, .length = sizeof(*tx), .lkey = f->ctl_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = CTL_DEPTH, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	struct ibv_wc wc;
	int n;

	*tx = *m;
	if (ibv_post_send(f->leader->qp, &wr, &bad))
		return -EIO;
	do {
		n = ibv_poll_cq(f->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != CTL_DEPTH));
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

static int grant_one(struct follower *f, struct log_seg *s, int idx)
{
	struct ctl_msg m = {
		.type = CTL_SEG_GRANT, .seg = (uint32_t)idx, .index = s->first_index,
		.addr = (uintptr_t)s->buf, .rkey = s->mr->rkey, .len = SEG_BYTES,
	};

	return ctl_send(f, &m);
}

int grant_segments(struct follower *f, uint64_t first_index, int n)
{
	int base = f->nseg, i, j, ret;

	if (base + n > MAX_SEGS)
		return -ENOSPC;
	for (i = 0; i < n; i++) {
		struct log_seg *s = &f->seg[base + i];

		ret = seg_register(f, s);
		if (ret)
			goto unwind;
		s->first_index = first_index + (uint64_t)i * SEG_ENTRIES;
		ret = grant_one(f, s, base + i);
		if (ret)
			goto unwind;	/* BUG: rdma-mr-leak -- segment i is registered, but the unwind below stops before it */
		s->granted = 1;
	}
	f->nseg += n;
	return 0;

unwind:
	for (j = 0; j < i; j++)
		seg_unregister(&f->seg[base + j]);
	return ret;
}

/* Compaction: the snapshot covers this segment; the leader was told. */
static void seg_retire(struct follower *f, struct log_seg *s)
{
	ibv_dereg_mr(s->mr);
	s->mr = NULL;		/* OK: rdma-mr-leak -- deregistered just above */
	s->granted = 0;
	s->next_free = f->seg_free;	/* OK: rdma-invalidation-leak -- recycled only after the MR is gone */
	f->seg_free = s;
}

void log_compact(struct follower *f, uint64_t snapshot_index)
{
	struct ctl_msg m = { .type = CTL_SEG_REVOKE };
	int i;

	for (i = 0; i < f->nseg; i++) {
		struct log_seg *s = &f->seg[i];

		if (!s->granted || s->first_index + SEG_ENTRIES > snapshot_index)
			continue;
		m.seg = (uint32_t)i;
		m.index = s->first_index;
		if (ctl_send(f, &m))
			LOG_ERR("revoke notice for segment %d not sent", i);
		seg_retire(f, s);
	}
}

/* A new leader's log diverges at 'from': drop the conflicting tail. */
void log_truncate_suffix(struct follower *f, uint64_t from)
{
	int i;

	for (i = f->nseg - 1; i >= 0; i--) {
		struct log_seg *s = &f->seg[i];

		if (!s->granted || s->first_index < from)
			continue;
		memset(s->buf, 0, SEG_BYTES);
		s->granted = 0;
		s->next_free = f->seg_free;	/* BUG: rdma-invalidation-leak -- the deposed leader still holds this segment's rkey and the MR stays registered */
		f->seg_free = s;
	}
	if (f->last_index >= from)
		f->last_index = from ? from - 1 : 0;
}

struct log_seg *seg_take(struct follower *f)
{
	struct log_seg *s = f->seg_free;

	if (!s)
		return NULL;
	f->seg_free = s->next_free;
	if (!s->mr && seg_register(f, s))
		return NULL;
	return s;
}

static int post_ctl_recvs(struct follower *f)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	int i;

	for (i = 0; i < CTL_DEPTH; i++) {
		sge.addr = (uintptr_t)&f->ctl[i];
		sge.length = sizeof(f->ctl[i]);
		sge.lkey = f->ctl_mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = (uint64_t)i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		if (ibv_post_recv(f->leader->qp, &wr, &bad))
			return -EIO;
	}
	return 0;
}

int accept_leader(struct follower *f, struct rdma_cm_id *id, uint32_t term)
{
	struct ibv_qp_init_attr qpa = {
		.send_cq = f->cq, .recv_cq = f->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = CTL_DEPTH + 64,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	struct rdma_conn_param cp = { .responder_resources = 1, .rnr_retry_count = 7 };
	struct accept_pdata pd;
	struct rdma_cm_event *ev;
	int ok;

	if (rdma_create_qp(id, f->pd, &qpa))
		return -errno;
	f->leader = id;
	f->term = term;

	f->commit = aligned_alloc(4096, 4096);
	if (!f->commit)
		goto err_qp;
	*f->commit = 0;
	f->commit_mr = ibv_reg_mr(f->pd, f->commit, 4096,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!f->commit_mr)
		goto err_commit;
	if (post_ctl_recvs(f))
		goto err_commit_mr;

	pd.commit_addr = (uintptr_t)f->commit;
	pd.commit_rkey = f->commit_mr->rkey;
	pd.term = term;
	cp.private_data = &pd;
	cp.private_data_len = sizeof(pd);
	if (rdma_accept(id, &cp))
		goto err_commit_mr;

	if (rdma_get_cm_event(f->ec, &ev))
		goto err_established;
	ok = ev->event == RDMA_CM_EVENT_ESTABLISHED;
	rdma_ack_cm_event(ev);
	if (!ok)
		goto err_established;
	return 0;

err_established:
	LOG_ERR("leader for term %u never established", term);
	free(f->commit);	/* BUG: rdma-invalidation-leak -- the commit page's rkey left in the accept private data; the page is freed while still registered */
	f->commit = NULL;
	rdma_destroy_qp(id);
	f->leader = NULL;
	return -ECONNABORTED;	/* BUG: rdma-mr-leak -- commit_mr is never deregistered here and the next accept_leader() replaces it */

err_commit_mr:
	ibv_dereg_mr(f->commit_mr);
	f->commit_mr = NULL;
err_commit:
	free(f->commit);	/* OK: rdma-invalidation-leak -- the MR is deregistered first (or never existed) */
	f->commit = NULL;
err_qp:
	rdma_destroy_qp(id);
	f->leader = NULL;
	return -ENOMEM;		/* OK: rdma-mr-leak -- commit_mr released on every path that reaches here */
}

void on_leader_lost(struct follower *f)
{
	ibv_dereg_mr(f->commit_mr);
	f->commit_mr = NULL;	/* OK: rdma-mr-leak -- deregistered above */
	free(f->commit);	/* OK: rdma-invalidation-leak -- the old leader's commit key died with the MR */
	f->commit = NULL;
	rdma_destroy_qp(f->leader);
	rdma_destroy_id(f->leader);
	f->leader = NULL;
}

int follower_poll(struct follower *f)
{
	struct ibv_wc wc[16];
	struct ctl_msg ack = { .type = CTL_APPEND_ACK };
	int n, k;

	n = ibv_poll_cq(f->cq, 16, wc);
	for (k = 0; k < n; k++) {
		if (wc[k].status != IBV_WC_SUCCESS) {
			LOG_ERR("completion error %s", ibv_wc_status_str(wc[k].status));
			return -EIO;
		}
		if (wc[k].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			uint32_t imm = ntohl(wc[k].imm_data);
			struct log_seg *s;

			if ((imm >> 16) >= (uint32_t)f->nseg)
				continue;
			s = &f->seg[imm >> 16];

			f->last_index = s->first_index + (imm & 0xffff);
			ack.index = f->last_index;
			if (ctl_send(f, &ack))
				return -EIO;
		}
	}
	return n;
}

void follower_destroy(struct follower *f)
{
	int i;

	if (f->leader) {
		rdma_disconnect(f->leader);
		free(f->commit);	/* BUG: rdma-invalidation-leak -- freed while commit_mr (remote write, key held by the leader) is still registered */
		ibv_dereg_mr(f->commit_mr);
		rdma_destroy_qp(f->leader);
		rdma_destroy_id(f->leader);
	}
	for (i = 0; i < f->nseg; i++)
		if (f->seg[i].mr)
			seg_unregister(&f->seg[i]);
	free(f->ctl);		/* OK: rdma-invalidation-leak -- ctl_mr is local-only, no key to outlive the buffer */
	ibv_dereg_mr(f->ctl_mr);
	ibv_dealloc_pd(f->pd);
}
