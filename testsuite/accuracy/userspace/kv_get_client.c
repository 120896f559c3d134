/*
 * kvget: client of a key-value store that serves GETs with one-sided RDMA
 * READs.  The server's hello message carries the address and rkey of its
 * hash index and of its value heap; a GET reads the key's bucket, then the
 * value the bucket points to.  librdmacm endpoint API (rdma_create_ep,
 * rdma_post_read, rdma_get_send_comp); one READ outstanding at a time.
 *
 * The bucket cache is registered with REMOTE_WRITE on purpose: it is the
 * sink of RDMA READs, and an iWARP READ response is a tagged placement into
 * the sink.  Its rkey is never sent; the right is still needed on iWARP, so
 * it is not an over-broad grant.  The value buffer was later switched to
 * rdma_reg_msgs() (LOCAL_WRITE only) and the READ into it fails on iWARP.
 * The connect path has a mislabelled unwind that leaks the bucket MR.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KV_BUCKET_SLOTS	8
#define KV_VAL_MAX	(64 * 1024)
#define KV_MAX_INFLIGHT	8

struct kv_hello {
	uint64_t index_addr;
	uint32_t index_rkey;
	uint32_t nbuckets;
	uint64_t heap_addr;
	uint32_t heap_rkey;
	uint32_t pad;
};

struct kv_slot {
	uint64_t key;
	uint64_t val_off;
	uint32_t val_len;
	uint32_t version;
};

struct kv_bucket {
	struct kv_slot slot[KV_BUCKET_SLOTS];
};

struct kv_client {
	struct rdma_cm_id *id;
	struct ibv_mr     *hello_mr;
	struct ibv_mr     *bucket_mr;
	struct ibv_mr     *val_mr;
	struct kv_hello    hello;
	struct kv_bucket   bucket;
	char              *val_buf;
};

static uint64_t kv_hash(uint64_t key)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return key;
}

int kv_connect(struct kv_client *c, const char *host, const char *port)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct ibv_qp_init_attr attr;
	struct ibv_wc wc;
	int ret;

	memset(c, 0, sizeof(*c));
	ret = rdma_getaddrinfo(host, port, &hints, &res);
	if (ret)
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = KV_MAX_INFLIGHT;
	attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	ret = rdma_create_ep(&c->id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	if (ret)
		return -errno;

	c->val_buf = malloc(KV_VAL_MAX);
	if (!c->val_buf)
		goto out_ep;

	/* OK: rdma-local-mr-management -- receive buffer for the hello, local access only */
	c->hello_mr = rdma_reg_msgs(c->id, &c->hello, sizeof(c->hello));
	if (!c->hello_mr)
		goto out_buf;
	/* iWARP READ responses are placed through the sink's STag */
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE on a READ sink is needed on iWARP even though the rkey is never sent */
	c->bucket_mr = ibv_reg_mr(c->id->pd, &c->bucket, sizeof(c->bucket), // BUG: rdma-local-mr-management -- MR addresses the ULP's own RDMA READ
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!c->bucket_mr)
		goto out_hello;
	c->val_mr = rdma_reg_msgs(c->id, c->val_buf, KV_VAL_MAX); // BUG: rdma-local-mr-management -- MR addresses the ULP's own RDMA READ
	if (!c->val_mr)
		goto out_hello; // BUG: rdma-mr-leak -- should be out_bucket: c->bucket_mr is not deregistered

	ret = rdma_post_recv(c->id, c, &c->hello, sizeof(c->hello), c->hello_mr);
	if (ret)
		goto out_val;
	ret = rdma_connect(c->id, NULL);
	if (ret)
		goto out_val;
	ret = rdma_get_recv_comp(c->id, &wc);
	if (ret <= 0 || wc.status != IBV_WC_SUCCESS)
		goto out_disconnect;
	return 0;

out_disconnect:
	rdma_disconnect(c->id);
out_val:
	rdma_dereg_mr(c->val_mr);
	rdma_dereg_mr(c->bucket_mr);
out_hello:
	rdma_dereg_mr(c->hello_mr);
out_buf:
	free(c->val_buf);
out_ep:
	rdma_destroy_ep(c->id);
	return -EIO;
}

static int kv_read_sync(struct kv_client *c)
{
	struct ibv_wc wc;
	int ret;

	ret = rdma_get_send_comp(c->id, &wc);
	if (ret <= 0)
		return -EIO;
	return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
}

int kv_get(struct kv_client *c, uint64_t key, void *out, size_t *len)
{
	uint32_t nb = be32toh(c->hello.nbuckets);
	uint64_t idx = kv_hash(key) % nb;
	struct kv_slot *s = NULL;
	uint32_t vlen;
	int i, ret;

	/* OK: rdma-access-flags-transport -- the bucket sink carries REMOTE_WRITE */
	ret = rdma_post_read(c->id, c, &c->bucket, sizeof(c->bucket), c->bucket_mr,
			     IBV_SEND_SIGNALED,
			     be64toh(c->hello.index_addr) + idx * sizeof(struct kv_bucket),
			     be32toh(c->hello.index_rkey));
	if (ret || kv_read_sync(c))
		return -EIO;

	for (i = 0; i < KV_BUCKET_SLOTS; i++) {
		if (c->bucket.slot[i].key == htobe64(key)) {
			s = &c->bucket.slot[i];
			break;
		}
	}
	if (!s)
		return -ENOENT;
	vlen = be32toh(s->val_len);
	if (vlen > KV_VAL_MAX || vlen > *len)
		return -ENOSPC;

	/* OK: rdma-unsignaled-send-starvation -- every READ is signaled and reaped */
	ret = rdma_post_read(c->id, c, c->val_buf, vlen, c->val_mr, IBV_SEND_SIGNALED, // BUG: rdma-access-flags-transport -- READ sink registered LOCAL_WRITE only; fails on iWARP
			     be64toh(c->hello.heap_addr) + be64toh(s->val_off),
			     be32toh(c->hello.heap_rkey));
	if (ret || kv_read_sync(c))
		return -EIO;
	memcpy(out, c->val_buf, vlen);
	*len = vlen;
	return 0;
}

void kv_disconnect(struct kv_client *c)
{
	rdma_disconnect(c->id);
	rdma_dereg_mr(c->val_mr);
	rdma_dereg_mr(c->bucket_mr);
	rdma_dereg_mr(c->hello_mr);
	free(c->val_buf);
	rdma_destroy_ep(c->id);
}
