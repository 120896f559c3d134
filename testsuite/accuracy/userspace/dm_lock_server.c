/*
 * dmlock: a lock service whose lock table lives in NIC device memory
 * (ibv_alloc_dm), so that clients' remote atomics (CAS / fetch-add on the
 * lock words) do not cross PCIe.  When the device has no device memory the
 * table is kept in host memory.  The table's rkey is published to each
 * client in a hello SEND when it connects.
 *
 * Correct: device-memory MRs are registered zero-based, with LOCAL_WRITE
 * next to the remote atomic rights; the host fallback likewise; these
 * registrations happen once per server, not per I/O, even though the
 * publishing function also posts the hello.
 * Not correct: when posting the hello fails, lock_srv_publish() returns
 * with the freshly registered device-memory MR held only in a local.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOCK_WORDS		4096
#define LOCK_TABLE_BYTES	(LOCK_WORDS * sizeof(uint64_t))
#define LOCK_ACCESS		(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | \
				 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

struct lock_hello {
	uint64_t base;
	uint32_t rkey;
	uint32_t nwords;
};

struct lock_srv {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_dm      *dm;
	uint64_t           *host_table;
	struct ibv_mr      *table_mr;
	struct lock_hello   hello;
};

static int lock_post_hello(struct ibv_qp *qp, struct lock_hello *h)
{
	struct ibv_sge sge = { .addr = (uintptr_t)h, .length = sizeof(*h) };
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
	}, *bad;

	return ibv_post_send(qp, &wr, &bad);
}

static int lock_srv_host_table(struct lock_srv *s, struct ibv_qp *qp)
{
	s->host_table = calloc(LOCK_WORDS, sizeof(uint64_t));
	if (!s->host_table)
		return -ENOMEM;
	/* OK: rdma-registration-in-datapath -- one table per server; the hello post does not make this per-I/O */
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE is part of LOCK_ACCESS */
	s->table_mr = ibv_reg_mr(s->pd, s->host_table, LOCK_TABLE_BYTES, LOCK_ACCESS); // BUG: rdma-local-mr-management -- rkey handed to the clients
	if (!s->table_mr) {
		free(s->host_table);
		return -errno;
	}
	s->hello.base = htobe64((uintptr_t)s->host_table);
	s->hello.rkey = htobe32(s->table_mr->rkey);
	s->hello.nwords = htobe32(LOCK_WORDS);
	/* OK: rdma-mr-leak -- on failure the MR stays in s->table_mr and is released by lock_srv_fini() */
	return lock_post_hello(qp, &s->hello);
}

int lock_srv_publish(struct lock_srv *s, struct ibv_qp *qp)
{
	struct ibv_alloc_dm_attr dattr = { .length = LOCK_TABLE_BYTES, .log_align_req = 3 };
	static const uint64_t zeros[LOCK_WORDS];
	struct ibv_mr *mr;

	if (s->table_mr)
		return lock_post_hello(qp, &s->hello);

	s->dm = ibv_alloc_dm(s->ctx, &dattr);
	if (!s->dm)
		return lock_srv_host_table(s, qp);
	/* OK: rdma-access-flags-invalid -- zero-based device memory with LOCAL_WRITE */
	mr = ibv_reg_dm_mr(s->pd, s->dm, 0, LOCK_TABLE_BYTES, // BUG: rdma-local-mr-management -- rkey handed to the clients
			   IBV_ACCESS_ZERO_BASED | LOCK_ACCESS);
	if (!mr) {
		ibv_free_dm(s->dm);
		s->dm = NULL;
		return -errno;
	}
	ibv_memcpy_to_dm(s->dm, 0, zeros, LOCK_TABLE_BYTES);
	s->hello.base = 0;
	s->hello.rkey = htobe32(mr->rkey);
	s->hello.nwords = htobe32(LOCK_WORDS);
	if (lock_post_hello(qp, &s->hello))
		return -EIO; // BUG: rdma-mr-leak -- 'mr' is neither stored nor deregistered on this error return
	s->table_mr = mr;
	return 0;
}

void lock_srv_fini(struct lock_srv *s)
{
	if (s->table_mr)
		ibv_dereg_mr(s->table_mr);
	if (s->dm)
		ibv_free_dm(s->dm);
	free(s->host_table);
}
