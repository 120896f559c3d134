/*
 * kvput_server.c - RDMA PUT server for a small key-value cache.
 *
 * One client per process, connected with rdma_cm.  Small values arrive
 * inline in the request SEND.  Medium values are RDMA-written by the client
 * into a slot of the connection's landing zone, registered once when the
 * connection is set up; its rkey travels in the accept private data
 * together with the rkey of the per-connection atomic counters.  Large
 * values get a per-request grant: the server allocates a buffer, registers
 * it for remote write, returns the rkey in a GRANT message, and the client
 * writes the value and SENDs PUT_DONE.  A timer thread reaps grants the
 * client never finished.
 *
 * The grant path registers per request and some of its error and timeout
 * paths free the buffer while the grant's rkey is still registered; the
 * statistics region grants remote read nobody is told about, and the
 * counters are registered with an invalid flag set.
 *
 * NOT-ANNOTATED: rdma-local-mr-management -- migration notes not annotated in this file
 */
#include <errno.h>
#include <endian.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define KVS_RECV_DEPTH		2048
#define KVS_RECV_SGE		8	/* header + up to 7 inline pages */
#define KVS_SEND_DEPTH		256
#define KVS_MSG_SIZE		4096
#define KVS_SLOTS		64
#define KVS_SLOT_SIZE		(64 * 1024)
#define KVS_MAX_GRANTS		16
#define KVS_GRANT_TIMEOUT	5	/* seconds */
#define KVS_BOUNCE_SIZE		(1u << 20)

#define KVS_LZ_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

enum kvs_op {
	KVS_OP_PUT_INLINE = 1,
	KVS_OP_PUT_SLOT,
	KVS_OP_PUT_LARGE,
	KVS_OP_PUT_DONE,
	KVS_OP_GRANT,
	KVS_OP_ACK,
	KVS_OP_STATS,
};

struct kvs_msg {
	uint32_t op;
	uint32_t len;
	uint64_t key;
	uint64_t addr;
	uint32_t rkey;
	uint32_t crc;
	int32_t status;
	uint32_t slot;
	uint8_t data[];
};

struct kvs_private {
	uint64_t lz_addr;
	uint32_t lz_rkey;
	uint32_t nslots;
	uint64_t ctr_addr;
	uint32_t ctr_rkey;
	uint32_t slot_size;
};

struct kvs_stats {
	uint64_t puts;
	uint64_t grants;
	uint64_t reaped;
	uint64_t bytes;
};

struct kvs_grant {
	uint64_t key;
	void *buf;
	size_t len;
	struct ibv_mr *mr;
	time_t started;
	int in_use;
};

struct kvs_conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;

	void *recv_ring;
	struct ibv_mr *recv_mr;
	void *send_ring;
	struct ibv_mr *send_mr;
	unsigned int send_head;

	void *lz;
	struct ibv_mr *lz_mr;
	uint64_t *counters;
	struct ibv_mr *ctr_mr;
	struct kvs_stats *stats;
	struct ibv_mr *stats_mr;

	void *bounce;
	struct ibv_mr *bounce_mr;

	pthread_mutex_t lock;
	struct kvs_grant grants[KVS_MAX_GRANTS];
	int allow_atomic;
	int verify_grants;
	volatile int stop;
};

int kvs_store_put(uint64_t key, const void *val, size_t len);
uint32_t kvs_crc32(const void *buf, size_t len);

static int kvs_grant_access(const struct kvs_conn *c)
{
	int acc = IBV_ACCESS_REMOTE_WRITE;

	if (c->verify_grants)
		acc |= IBV_ACCESS_REMOTE_READ;	/* client reads the value back */
	return acc;
}

static int kvs_create_qp(struct kvs_conn *c)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(c->id->verbs, &da))
		return -errno;
	if (da.max_qp_wr < KVS_RECV_DEPTH) {
		fprintf(stderr, "kvs: device queues too small (%d)\n", da.max_qp_wr);
		return -ENOSPC;
	}

	c->cq = ibv_create_cq(c->id->verbs, KVS_RECV_DEPTH + KVS_SEND_DEPTH,
			      c, NULL, 0);
	if (!c->cq)
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 1;
	attr.cap.max_send_wr = KVS_SEND_DEPTH;
	attr.cap.max_recv_wr = KVS_RECV_DEPTH;	// OK: rdma-queue-cap-unchecked -- compared with max_qp_wr above
	attr.cap.max_send_sge = 2;
	attr.cap.max_recv_sge = KVS_RECV_SGE;	// BUG: rdma-queue-cap-unchecked -- 8 SGEs, never compared with da.max_sge
	attr.cap.max_inline_data = 64;

	if (rdma_create_qp(c->id, c->pd, &attr)) {
		ibv_destroy_cq(c->cq);
		return -errno;
	}
	c->qp = c->id->qp;
	return 0;
}

static int kvs_setup_buffers(struct kvs_conn *c)
{
	size_t ring = (size_t)KVS_RECV_DEPTH * KVS_MSG_SIZE;
	int lz_flags = KVS_LZ_ACCESS;

	c->recv_ring = malloc(ring);
	if (!c->recv_ring)
		return -ENOMEM;
	c->recv_mr = ibv_reg_mr(c->pd, c->recv_ring, ring, IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-registration-in-datapath -- connection setup, kept by the connection
	if (!c->recv_mr)
		goto err_recv;

	c->send_ring = malloc((size_t)KVS_SEND_DEPTH * KVS_MSG_SIZE);
	if (!c->send_ring)
		goto err_recv_mr;
	c->send_mr = ibv_reg_mr(c->pd, c->send_ring,
				(size_t)KVS_SEND_DEPTH * KVS_MSG_SIZE, 0);
	if (!c->send_mr)
		goto err_send;

	if (c->allow_atomic)
		lz_flags |= IBV_ACCESS_REMOTE_ATOMIC;
	if (posix_memalign(&c->lz, 4096, (size_t)KVS_SLOTS * KVS_SLOT_SIZE))
		goto err_send_mr;
	c->lz_mr = ibv_reg_mr(c->pd, c->lz, (size_t)KVS_SLOTS * KVS_SLOT_SIZE, lz_flags);	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE comes with the macro; rkey goes out in the accept data
	if (!c->lz_mr)
		goto err_lz;

	c->counters = calloc(KVS_SLOTS, sizeof(uint64_t));
	if (!c->counters)
		goto err_lz;
	// OK: rdma-remote-access-overbroad -- rkey goes out in the accept data
	c->ctr_mr = ibv_reg_mr(c->pd, c->counters, KVS_SLOTS * sizeof(uint64_t),
			       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);	// BUG: rdma-access-flags-invalid -- REMOTE_ATOMIC without LOCAL_WRITE
	if (!c->ctr_mr)
		goto err_ctr;

	c->stats = calloc(1, sizeof(*c->stats));
	if (!c->stats)
		goto err_ctr_mr;
	c->stats_mr = ibv_reg_mr(c->pd, c->stats, sizeof(*c->stats),
				 IBV_ACCESS_REMOTE_READ);	// BUG: rdma-remote-access-overbroad -- stats are SENT from this MR; its rkey is never given to the client
	if (!c->stats_mr)
		goto err_stats;
	return 0;

err_stats:
	free(c->stats);
err_ctr_mr:
	ibv_dereg_mr(c->ctr_mr);
err_ctr:
	free(c->counters);
err_lz:
	free(c->lz);	// BUG: rdma-invalidation-leak, rdma-mr-leak -- reached after lz_mr (remote write) was registered; the landing zone is freed and lz_mr never deregistered
err_send_mr:
	ibv_dereg_mr(c->send_mr);
err_send:
	free(c->send_ring);
err_recv_mr:
	ibv_dereg_mr(c->recv_mr);
err_recv:
	free(c->recv_ring);
	return -ENOMEM;
}

static int kvs_post_recv(struct kvs_conn *c, unsigned int idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)c->recv_ring + (size_t)idx * KVS_MSG_SIZE,
		.length = KVS_MSG_SIZE,
		.lkey = c->recv_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = idx, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

static int kvs_send_msg(struct kvs_conn *c, const struct kvs_msg *m, size_t len)
{
	unsigned int slot = c->send_head++ % KVS_SEND_DEPTH;
	void *dst = (char *)c->send_ring + (size_t)slot * KVS_MSG_SIZE;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	if (len > KVS_MSG_SIZE)
		return -EMSGSIZE;
	memcpy(dst, m, len);
	sge.addr = (uintptr_t)dst;
	sge.length = (uint32_t)len;
	sge.lkey = c->send_mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = slot;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_send(c->qp, &wr, &bad);
}

static int kvs_send_ack(struct kvs_conn *c, uint64_t key, int status)
{
	struct kvs_msg ack = { .op = KVS_OP_ACK, .key = htobe64(key),
			       .status = (int32_t)htobe32((uint32_t)status) };

	return kvs_send_msg(c, &ack, sizeof(ack));
}

/* Large stats replies go through a bounce buffer registered on first use. */
static int kvs_send_stats(struct kvs_conn *c)
{
	struct ibv_sge sge[2];
	struct ibv_send_wr wr, *bad;
	struct kvs_msg hdr = { .op = KVS_OP_STATS, .len = sizeof(*c->stats) };

	if (!c->bounce_mr) {
		c->bounce = malloc(KVS_BOUNCE_SIZE);
		if (!c->bounce)
			return -ENOMEM;
		c->bounce_mr = ibv_reg_mr(c->pd, c->bounce, KVS_BOUNCE_SIZE,
					  IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-registration-in-datapath -- registered on first use and kept by the connection
		if (!c->bounce_mr) {
			free(c->bounce);
			c->bounce = NULL;
			return -ENOMEM;
		}
	}
	memcpy(c->bounce, &hdr, sizeof(hdr));

	sge[0].addr = (uintptr_t)c->bounce;
	sge[0].length = sizeof(hdr);
	sge[0].lkey = c->bounce_mr->lkey;
	sge[1].addr = (uintptr_t)c->stats;
	sge[1].length = sizeof(*c->stats);
	sge[1].lkey = c->stats_mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = UINT64_MAX;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = sge;
	wr.num_sge = 2;
	return ibv_post_send(c->qp, &wr, &bad);
}

static struct kvs_grant *kvs_grant_get(struct kvs_conn *c)
{
	int i;

	for (i = 0; i < KVS_MAX_GRANTS; i++) {
		if (!c->grants[i].in_use) {
			c->grants[i].in_use = 1;
			return &c->grants[i];
		}
	}
	return NULL;
}

static struct kvs_grant *kvs_grant_find(struct kvs_conn *c, uint64_t key)
{
	int i;

	for (i = 0; i < KVS_MAX_GRANTS; i++)
		if (c->grants[i].in_use && c->grants[i].key == key)
			return &c->grants[i];
	return NULL;
}

static void kvs_grant_release(struct kvs_conn *c, struct kvs_grant *g)
{
	ibv_dereg_mr(g->mr);	// BUG: rdma-registration-in-datapath -- per-PUT deregistration on the receive completion path
	free(g->buf);	// OK: rdma-invalidation-leak -- the MR is gone before the memory
	pthread_mutex_lock(&c->lock);
	memset(g, 0, sizeof(*g));	// OK: rdma-mr-leak -- released above
	pthread_mutex_unlock(&c->lock);
}

static int kvs_handle_put_large(struct kvs_conn *c, const struct kvs_msg *req)
{
	struct kvs_msg reply;
	struct kvs_grant *g;
	size_t len = be32toh(req->len);
	int ret;

	pthread_mutex_lock(&c->lock);
	g = kvs_grant_get(c);
	pthread_mutex_unlock(&c->lock);
	if (!g)
		return kvs_send_ack(c, be64toh(req->key), -EBUSY);

	g->key = be64toh(req->key);
	g->len = len;
	g->buf = malloc(len);
	if (!g->buf) {
		g->in_use = 0;
		return kvs_send_ack(c, g->key, -ENOMEM);
	}
	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is added to the helper's flags; the rkey goes out in the GRANT
	g->mr = ibv_reg_mr(c->pd, g->buf, len,
			   IBV_ACCESS_LOCAL_WRITE | kvs_grant_access(c));	// BUG: rdma-registration-in-datapath -- one registration per large PUT, from the receive completion path
	if (!g->mr) {
		free(g->buf);
		g->in_use = 0;
		return kvs_send_ack(c, g->key, -ENOMEM);
	}
	g->started = time(NULL);

	memset(&reply, 0, sizeof(reply));
	reply.op = KVS_OP_GRANT;
	reply.key = htobe64(g->key);
	reply.addr = htobe64((uintptr_t)g->buf);
	reply.rkey = htobe32(g->mr->rkey);
	reply.len = htobe32((uint32_t)len);

	ret = kvs_send_msg(c, &reply, sizeof(reply));
	if (ret) {
		kvs_grant_release(c, g);	// OK: rdma-invalidation-leak, rdma-mr-leak -- the helper deregisters before freeing and wiping the slot
		return ret;
	}
	c->stats->grants++;
	return 0;
}

static int kvs_handle_put_done(struct kvs_conn *c, const struct kvs_msg *req)
{
	struct kvs_grant *g;
	uint64_t key = be64toh(req->key);
	int ret;

	pthread_mutex_lock(&c->lock);
	g = kvs_grant_find(c, key);
	pthread_mutex_unlock(&c->lock);
	if (!g)
		return kvs_send_ack(c, key, -ENOENT);

	if (kvs_crc32(g->buf, g->len) != be32toh(req->crc)) {
		kvs_send_ack(c, key, -EIO);
		free(g->buf);	// BUG: rdma-invalidation-leak -- the grant's rkey is still registered over the freed buffer; the client can keep writing into it
		pthread_mutex_lock(&c->lock);
		memset(g, 0, sizeof(*g));	// BUG: rdma-mr-leak -- the slot is wiped with g->mr still registered
		pthread_mutex_unlock(&c->lock);
		return -EIO;
	}

	ret = kvs_store_put(key, g->buf, g->len);
	c->stats->puts++;
	c->stats->bytes += g->len;
	kvs_grant_release(c, g);	// OK: rdma-invalidation-leak -- released through the helper that deregisters first
	return kvs_send_ack(c, key, ret);
}

static int kvs_handle_recv(struct kvs_conn *c, unsigned int idx, uint32_t len)
{
	const struct kvs_msg *m = (const void *)((char *)c->recv_ring +
						 (size_t)idx * KVS_MSG_SIZE);
	const uint8_t *slot;
	int ret;

	if (len < sizeof(*m))
		return -EPROTO;

	switch (m->op) {
	case KVS_OP_PUT_INLINE:
		ret = kvs_store_put(be64toh(m->key), m->data, be32toh(m->len));
		ret = kvs_send_ack(c, be64toh(m->key), ret);
		break;
	case KVS_OP_PUT_SLOT:
		if (be32toh(m->slot) >= KVS_SLOTS)
			return kvs_send_ack(c, be64toh(m->key), -EINVAL);
		slot = (const uint8_t *)c->lz + (size_t)be32toh(m->slot) * KVS_SLOT_SIZE;
		ret = kvs_store_put(be64toh(m->key), slot, be32toh(m->len));
		ret = kvs_send_ack(c, be64toh(m->key), ret);
		break;
	case KVS_OP_PUT_LARGE:
		ret = kvs_handle_put_large(c, m);
		break;
	case KVS_OP_PUT_DONE:
		ret = kvs_handle_put_done(c, m);
		break;
	case KVS_OP_STATS:
		ret = kvs_send_stats(c);
		break;
	default:
		ret = -EPROTO;
	}
	if (ret)
		return ret;
	return kvs_post_recv(c, idx);
}

static int kvs_poll(struct kvs_conn *c)
{
	struct ibv_wc wc[16];
	int n, i, ret;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "kvs: wc %s\n", ibv_wc_status_str(wc[i].status));
			return -EIO;
		}
		if (wc[i].opcode == IBV_WC_RECV) {
			ret = kvs_handle_recv(c, (unsigned int)wc[i].wr_id, wc[i].byte_len);
			if (ret)
				return ret;
		}
	}
	return n < 0 ? -EIO : 0;
}

/* Timer thread: clients that vanished mid-PUT leave grants behind. */
static void *kvs_reaper(void *arg)
{
	struct kvs_conn *c = arg;
	int i;

	while (!c->stop) {
		time_t now = time(NULL);

		sleep(1);
		pthread_mutex_lock(&c->lock);
		for (i = 0; i < KVS_MAX_GRANTS; i++) {
			struct kvs_grant *g = &c->grants[i];

			if (!g->in_use || now - g->started < KVS_GRANT_TIMEOUT)
				continue;
			free(g->buf);	// BUG: rdma-invalidation-leak -- buffer freed while the grant MR (rkey held by the client) is still registered
			ibv_dereg_mr(g->mr);	// OK: rdma-registration-in-datapath -- timer thread, neither submit nor completion path
			memset(g, 0, sizeof(*g));
			c->stats->reaped++;
		}
		pthread_mutex_unlock(&c->lock);
	}
	return NULL;
}

static void kvs_free_buffers(struct kvs_conn *c)
{
	int i;

	for (i = 0; i < KVS_MAX_GRANTS; i++) {
		if (!c->grants[i].in_use)
			continue;
		ibv_dereg_mr(c->grants[i].mr);	// OK: rdma-registration-in-datapath -- teardown of the whole grant table
		free(c->grants[i].buf);	// OK: rdma-invalidation-leak -- deregistered first
	}
	if (c->bounce_mr) {
		ibv_dereg_mr(c->bounce_mr);
		free(c->bounce);
	}
	ibv_dereg_mr(c->stats_mr);
	free(c->stats);
	ibv_dereg_mr(c->ctr_mr);
	free(c->counters);
	free(c->lz);	// BUG: rdma-invalidation-leak -- landing zone freed before its MR (rkey sent in the accept data) is deregistered
	ibv_dereg_mr(c->lz_mr);
	free(c->send_ring);	// OK: rdma-invalidation-leak -- send ring registered without remote access
	ibv_dereg_mr(c->send_mr);
	ibv_dereg_mr(c->recv_mr);
	free(c->recv_ring);
}

static int kvs_serve(struct kvs_conn *c)
{
	struct rdma_conn_param param;
	struct kvs_private priv;
	pthread_t reaper;
	unsigned int i;
	int ret;

	ret = kvs_setup_buffers(c);
	if (ret)
		return ret;
	ret = kvs_create_qp(c);
	if (ret)
		goto out_bufs;
	for (i = 0; i < KVS_RECV_DEPTH; i++) {
		ret = kvs_post_recv(c, i);
		if (ret)
			goto out_qp;
	}

	memset(&priv, 0, sizeof(priv));
	priv.lz_addr = htobe64((uintptr_t)c->lz);
	priv.lz_rkey = htobe32(c->lz_mr->rkey);
	priv.nslots = htobe32(KVS_SLOTS);
	priv.slot_size = htobe32(KVS_SLOT_SIZE);
	priv.ctr_addr = htobe64((uintptr_t)c->counters);
	priv.ctr_rkey = htobe32(c->ctr_mr->rkey);

	memset(&param, 0, sizeof(param));
	param.private_data = &priv;
	param.private_data_len = sizeof(priv);
	param.responder_resources = 1;
	ret = rdma_accept(c->id, &param);
	if (ret)
		goto out_qp;

	pthread_create(&reaper, NULL, kvs_reaper, c);
	while (!c->stop) {
		ret = kvs_poll(c);
		if (ret)
			break;
	}
	c->stop = 1;
	pthread_join(reaper, NULL);
	rdma_disconnect(c->id);
out_qp:
	rdma_destroy_qp(c->id);
	ibv_destroy_cq(c->cq);
out_bufs:
	kvs_free_buffers(c);
	return ret;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res;
	struct rdma_cm_id *listen_id;
	struct kvs_conn conn = { .allow_atomic = argc > 2 };
	int ret;

	pthread_mutex_init(&conn.lock, NULL);
	if (rdma_getaddrinfo(NULL, argc > 1 ? argv[1] : "7471", &hints, &res))
		return 1;
	if (rdma_create_ep(&listen_id, res, NULL, NULL) || rdma_listen(listen_id, 1) ||
	    rdma_get_request(listen_id, &conn.id))
		return 1;
	rdma_freeaddrinfo(res);

	conn.pd = ibv_alloc_pd(conn.id->verbs);
	if (!conn.pd)
		return 1;
	ret = kvs_serve(&conn);
	ibv_dealloc_pd(conn.pd);
	rdma_destroy_id(conn.id);
	rdma_destroy_ep(listen_id);
	return ret ? 1 : 0;
}
