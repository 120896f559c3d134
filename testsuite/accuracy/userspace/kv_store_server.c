/*
 * kvs: server side of a read-mostly key-value store.  The store (index +
 * value heap, one allocation) is registered REMOTE_READ only and its rkey
 * is announced to every client in a hello message sent inline right after
 * the connection is accepted; clients serve GETs with one-sided READs.
 * Updates are appended to a local log and shipped to replica connections
 * with SENDs from the log buffer.
 *
 * Correct: REMOTE_READ without LOCAL_WRITE is a valid registration (the
 * CPU writes the store, the HCA only reads it); the store's key is sent.
 * Not correct: the log buffer was registered with the store's flags "for
 * a future RDMA-WRITE replication mode" and its rkey never leaves this
 * file; growing the store frees the old memory and overwrites the old MR
 * handle, so the old key stays valid over freed memory.
 */
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVS_MAX_CONNS	64
#define KVS_LOG_SIZE	(8u << 20)
#define KVS_SIG_EVERY	8

struct kvs_hello {
	uint64_t index_addr;
	uint32_t index_rkey;
	uint32_t nbuckets;
	uint64_t heap_addr;
	uint32_t heap_rkey;
	uint32_t pad;
};

struct kvs_conn {
	struct rdma_cm_id *id;
	int                replica;
	unsigned int       unsig;
};

struct kvs {
	struct rdma_event_channel *ech;
	struct rdma_cm_id         *listen_id;
	struct ibv_pd             *pd;
	struct ibv_cq             *cq;
	char                      *store;
	size_t                     store_len;
	uint32_t                   nbuckets;
	size_t                     heap_off;
	struct ibv_mr             *store_mr;
	char                      *log;
	size_t                     log_tail;
	struct ibv_mr             *log_mr;
	struct kvs_conn            conns[KVS_MAX_CONNS];
	int                        nconns;
};

int kvs_setup_memory(struct kvs *s, size_t store_len, uint32_t nbuckets)
{
	s->store_len = store_len;
	s->nbuckets = nbuckets;
	s->heap_off = (size_t)nbuckets * 256;
	s->store = calloc(1, store_len);
	if (!s->store)
		return -ENOMEM;
	/* OK: rdma-access-flags-invalid -- REMOTE_READ alone needs no LOCAL_WRITE */
	/* OK: rdma-remote-access-overbroad -- the rkey goes into every client's hello */
	s->store_mr = ibv_reg_mr(s->pd, s->store, store_len, IBV_ACCESS_REMOTE_READ); // BUG: rdma-local-mr-management -- rkey handed to the peer
	if (!s->store_mr)
		goto err_store;

	s->log = malloc(KVS_LOG_SIZE);
	if (!s->log)
		goto err_store_mr;
	// BUG: rdma-remote-access-overbroad -- remote read/write on the log, but only its lkey is ever used
	s->log_mr = ibv_reg_mr(s->pd, s->log, KVS_LOG_SIZE,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			       IBV_ACCESS_REMOTE_WRITE);
	if (!s->log_mr)
		goto err_log;
	return 0;

err_log:
	free(s->log);
err_store_mr:
	ibv_dereg_mr(s->store_mr);
err_store:
	free(s->store);
	return -ENOMEM;
}

static int kvs_send_hello(struct kvs *s, struct kvs_conn *c)
{
	struct kvs_hello h = {
		.index_addr = htobe64((uintptr_t)s->store),
		.index_rkey = htobe32(s->store_mr->rkey),
		.nbuckets   = htobe32(s->nbuckets),
		.heap_addr  = htobe64((uintptr_t)s->store + s->heap_off),
		.heap_rkey  = htobe32(s->store_mr->rkey),
	};
	struct ibv_sge sge = { .addr = (uintptr_t)&h, .length = sizeof(h) };
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
	}, *bad;

	return ibv_post_send(c->id->qp, &wr, &bad);
}

int kvs_grow(struct kvs *s, size_t new_len)
{
	struct ibv_mr *nmr;
	char *nstore;
	int i;

	nstore = calloc(1, new_len);
	if (!nstore)
		return -ENOMEM;
	memcpy(nstore, s->store, s->store_len);
	/* OK: rdma-registration-in-datapath -- growing the store is a rare control event, not per I/O */
	nmr = ibv_reg_mr(s->pd, nstore, new_len, IBV_ACCESS_REMOTE_READ); // BUG: rdma-local-mr-management -- rkey handed to the peer
	if (!nmr) {
		free(nstore);
		return -errno;
	}
	// BUG: rdma-invalidation-leak -- the old store_mr still grants REMOTE_READ over the freed store
	free(s->store);
	s->store = nstore;
	s->store_len = new_len;
	s->store_mr = nmr; // BUG: rdma-mr-leak -- the previous store MR is overwritten without ibv_dereg_mr()
	for (i = 0; i < s->nconns; i++)
		kvs_send_hello(s, &s->conns[i]);
	return 0;
}

int kvs_replicate(struct kvs *s, const void *rec, uint32_t len)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	int i, ret = 0;

	if (s->log_tail + len > KVS_LOG_SIZE)
		s->log_tail = 0;
	memcpy(s->log + s->log_tail, rec, len);
	sge.addr = (uintptr_t)(s->log + s->log_tail);
	sge.length = len;
	sge.lkey = s->log_mr->lkey;
	s->log_tail += len;

	for (i = 0; i < s->nconns; i++) {
		struct kvs_conn *c = &s->conns[i];

		if (!c->replica)
			continue;
		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_SEND;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		/* OK: rdma-unsignaled-send-starvation -- every KVS_SIG_EVERY-th send is signaled, counter advanced here */
		if (++c->unsig >= KVS_SIG_EVERY) {
			wr.send_flags = IBV_SEND_SIGNALED;
			c->unsig = 0;
		}
		ret |= ibv_post_send(c->id->qp, &wr, &bad);
	}
	return ret;
}

static int kvs_accept(struct kvs *s, struct rdma_cm_id *id, int replica)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = 4 * KVS_SIG_EVERY,
			.max_recv_wr = 1,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = sizeof(struct kvs_hello), /* OK: rdma-queue-cap-unchecked -- 32 bytes, within every device's limit */
		},
	};
	struct kvs_conn *c;

	if (s->nconns == KVS_MAX_CONNS)
		return rdma_reject(id, NULL, 0);
	if (rdma_create_qp(id, s->pd, &attr))
		return -errno;
	if (rdma_accept(id, NULL)) {
		rdma_destroy_qp(id);
		return -errno;
	}
	c = &s->conns[s->nconns++];
	c->id = id;
	c->replica = replica;
	c->unsig = 0;
	return kvs_send_hello(s, c);
}

void kvs_run(struct kvs *s)
{
	struct rdma_cm_event *ev;
	struct ibv_wc wc[16];

	while (rdma_get_cm_event(s->ech, &ev) == 0) {
		struct rdma_cm_id *id = ev->id;
		enum rdma_cm_event_type type = ev->event;
		int replica = ev->param.conn.private_data_len > 0;

		rdma_ack_cm_event(ev);
		if (type == RDMA_CM_EVENT_CONNECT_REQUEST && kvs_accept(s, id, replica))
			fprintf(stderr, "kvs: accept failed\n");
		while (ibv_poll_cq(s->cq, 16, wc) > 0)
			;
	}
}

void kvs_shutdown(struct kvs *s)
{
	int i;

	for (i = 0; i < s->nconns; i++) {
		rdma_disconnect(s->conns[i].id);
		rdma_destroy_qp(s->conns[i].id);
		rdma_destroy_id(s->conns[i].id);
	}
	ibv_dereg_mr(s->log_mr);
	ibv_dereg_mr(s->store_mr);
	free(s->log);
	free(s->store);
}
