/*
 * shmem_heap.c - symmetric heap and one-sided transport of an OpenSHMEM
 * runtime over InfiniBand verbs.
 *
 * Every PE registers its symmetric heap once and exchanges (base, rkey)
 * with all other PEs at startup; puts are RDMA WRITEs, gets RDMA READs,
 * atomics land their fetched value in a per-PE scratch buffer.  The heap
 * can grow at shmem_realloc() time.  Barriers run over a separate control
 * QP with small inline SENDs.  Only InfiniBand devices are used.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define SHMEM_MAX_OUTSTANDING   4096
#define SHMEM_NPES_MAX          1024
#define SHMEM_GET_BOUNCE        (1 << 20)
#define SHMEM_INLINE            220

#define SHMEM_ERROR(fmt, ...)   fprintf(stderr, "[shmem] " fmt, ##__VA_ARGS__)

struct shmem_tmp_reg {
	struct shmem_tmp_reg *next;
	struct ibv_mr        *mr;
};

struct shmem_peer {
	uint64_t        heap_base;
	uint32_t        heap_rkey;
	struct ibv_qp  *qp;
	struct ibv_qp  *ctrl_qp;
};

struct shmem_state {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_cq       *ctrl_cq;
	struct ibv_device_attr dev_attr;
	char                *heap_base;
	size_t               heap_len;
	struct ibv_mr       *heap_mr;
	uint64_t            *scratch;           /* atomic fetch results */
	struct ibv_mr       *scratch_mr;
	char                *get_bounce;
	struct ibv_mr       *get_bounce_mr;
	char                *ctrl_ring;         /* barrier messages received */
	struct ibv_mr       *ctrl_ring_mr;
	uint32_t             inline_max;
	unsigned int         outstanding;
	struct shmem_tmp_reg *tmp_regs;         /* non-symmetric sources, until quiet */
	struct shmem_peer    peers[SHMEM_NPES_MAX];
	int                  npes, me;
};

static struct shmem_state shm;

int shmem_internal_exchange_keys(struct shmem_peer *peers, uint64_t base, uint32_t rkey);
void shmem_quiet(void);

int shmem_transport_open(void)
{
	struct ibv_device **list;
	struct ibv_device_attr attr;
	int i, n;

	list = ibv_get_device_list(&n);
	if (!list)
		return -ENODEV;
	for (i = 0; i < n && !shm.ctx; i++) {
		if (list[i]->transport_type != IBV_TRANSPORT_IB)
			continue;		/* InfiniBand only */
		shm.ctx = ibv_open_device(list[i]);
	}
	ibv_free_device_list(list);
	if (!shm.ctx || ibv_query_device(shm.ctx, &attr))
		return -ENODEV;
	shm.dev_attr = attr;
	shm.pd = ibv_alloc_pd(shm.ctx);
	shm.cq = ibv_create_cq(shm.ctx, SHMEM_MAX_OUTSTANDING, NULL, NULL, 0);
	shm.ctrl_cq = ibv_create_cq(shm.ctx, 2 * SHMEM_NPES_MAX, NULL, NULL, 0);
	return shm.pd && shm.cq && shm.ctrl_cq ? 0 : -ENOMEM;
}

static struct ibv_qp *shmem_create_data_qp(void)
{
	struct ibv_qp_init_attr qpa = { .send_cq = shm.cq, .recv_cq = shm.cq, .qp_type = IBV_QPT_RC };
	struct ibv_qp *qp;

	/* OK: rdma-queue-cap-unchecked -- clamped to the device's max_qp_wr */
	qpa.cap.max_send_wr = SHMEM_MAX_OUTSTANDING < shm.dev_attr.max_qp_wr ? SHMEM_MAX_OUTSTANDING : shm.dev_attr.max_qp_wr;
	qpa.cap.max_recv_wr = 1;
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	/* OK: rdma-queue-cap-unchecked -- the inline size actually granted is read back */
	qpa.cap.max_inline_data = SHMEM_INLINE;
	qpa.sq_sig_all = 1;
	qp = ibv_create_qp(shm.pd, &qpa);
	if (qp)
		shm.inline_max = qpa.cap.max_inline_data;
	return qp;
}

static struct ibv_qp *shmem_create_ctrl_qp(void)
{
	struct ibv_qp_init_attr qpa = { .send_cq = shm.ctrl_cq, .recv_cq = shm.ctrl_cq, .qp_type = IBV_QPT_RC };

	qpa.cap.max_send_wr = 2 * shm.npes;	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- two barrier phases of one SEND per peer; nothing here registers or invalidates */
	qpa.cap.max_recv_wr = 2 * SHMEM_NPES_MAX;	// BUG: rdma-queue-cap-unchecked -- 2048 receives, one per peer and barrier phase, never compared with max_qp_wr
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	qpa.cap.max_inline_data = 16;
	qpa.sq_sig_all = 0;	// BUG(file): rdma-unsignaled-send-starvation -- the barrier SENDs on the control QP never ask for a completion
	return ibv_create_qp(shm.pd, &qpa);
}

int shmem_heap_init(size_t len)
{
	int i;

	shm.heap_base = aligned_alloc(2 * 1024 * 1024, len);
	shm.scratch = calloc(SHMEM_NPES_MAX, sizeof(uint64_t));
	shm.get_bounce = malloc(SHMEM_GET_BOUNCE);
	if (!shm.heap_base || !shm.scratch || !shm.get_bounce)
		return -ENOMEM;
	shm.heap_len = len;

	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- full rights with LOCAL_WRITE; every PE receives the key */
	shm.heap_mr = ibv_reg_mr(shm.pd, shm.heap_base, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);	// BUG: rdma-local-mr-management -- the heap's rkey goes to every PE
	if (!shm.heap_mr)
		return -errno;
	shm.scratch_mr = ibv_reg_mr(shm.pd, shm.scratch, SHMEM_NPES_MAX * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);	// BUG: rdma-remote-access-overbroad, rdma-local-mr-management -- fetched values land here by local scatter; no PE ever gets this rkey
	if (!shm.scratch_mr)
		goto err_heap_mr;
	// BUG: rdma-local-mr-management -- local sink of the runtime's own RDMA READs
	shm.get_bounce_mr = ibv_reg_mr(shm.pd, shm.get_bounce, SHMEM_GET_BOUNCE, IBV_ACCESS_LOCAL_WRITE);
	if (!shm.get_bounce_mr)
		goto err_heap_mr;	// BUG: rdma-mr-leak -- scratch_mr is not released on this path

	shm.ctrl_ring = calloc(2 * SHMEM_NPES_MAX, sizeof(uint32_t));
	/* OK: rdma-local-mr-management -- barrier receive ring, registered once for local access */
	shm.ctrl_ring_mr = shm.ctrl_ring ? ibv_reg_mr(shm.pd, shm.ctrl_ring, 2 * SHMEM_NPES_MAX * sizeof(uint32_t), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!shm.ctrl_ring_mr) {
		ibv_dereg_mr(shm.get_bounce_mr);
		ibv_dereg_mr(shm.scratch_mr);	/* OK: rdma-mr-leak -- this error path releases everything registered above */
		goto err_heap_mr;
	}

	for (i = 0; i < shm.npes; i++) {
		shm.peers[i].qp = shmem_create_data_qp();
		shm.peers[i].ctrl_qp = shmem_create_ctrl_qp();
	}
	return shmem_internal_exchange_keys(shm.peers, (uintptr_t)shm.heap_base, shm.heap_mr->rkey);

err_heap_mr:
	ibv_dereg_mr(shm.heap_mr);
	return -ENOMEM;
}

/* shmem_realloc() outgrew the heap: move to a bigger region */
int shmem_heap_grow(char *new_base, size_t new_len)
{
	struct ibv_mr *mr;

	// BUG: rdma-local-mr-management -- the grown heap is exposed to every PE
	mr = ibv_reg_mr(shm.pd, new_base, new_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		return -errno;
	memcpy(new_base, shm.heap_base, shm.heap_len);
	free(shm.heap_base);	// BUG: rdma-invalidation-leak -- the old heap is freed while its registration, whose rkey every PE holds, is still alive
	shm.heap_mr = mr;	// BUG: rdma-mr-leak -- the old heap registration is dropped without ibv_dereg_mr
	shm.heap_base = new_base;
	shm.heap_len = new_len;
	return shmem_internal_exchange_keys(shm.peers, (uintptr_t)new_base, mr->rkey);
}

/* same heap, atomics switched on after startup */
int shmem_heap_enable_atomics(void)
{
	return ibv_rereg_mr(shm.heap_mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);	// BUG: rdma-access-flags-invalid -- the new access drops LOCAL_WRITE while keeping remote write and atomics
}

static uint32_t shmem_src_lkey(const void *src, size_t len)
{
	struct shmem_tmp_reg *t;

	if ((const char *)src >= shm.heap_base && (const char *)src + len <= shm.heap_base + shm.heap_len)
		return shm.heap_mr->lkey;
	t = malloc(sizeof(*t));
	if (!t)
		return 0;
	// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- every put from a private buffer registers it
	t->mr = ibv_reg_mr(shm.pd, (void *)src, len, 0);
	if (!t->mr) {
		free(t);
		return 0;
	}
	t->next = shm.tmp_regs;
	shm.tmp_regs = t;
	return t->mr->lkey;
}

int shmem_put_nbi(void *dest, const void *src, size_t len, int pe)
{
	struct shmem_peer *p = &shm.peers[pe];
	struct ibv_sge sge = { (uintptr_t)src, (uint32_t)len, 0 };
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = p->heap_base + ((char *)dest - shm.heap_base);
	wr.wr.rdma.rkey = p->heap_rkey;
	if (len <= shm.inline_max)
		wr.send_flags = IBV_SEND_INLINE;
	else if (!(sge.lkey = shmem_src_lkey(src, len)))
		return -ENOMEM;
	shm.outstanding++;
	return ibv_post_send(p->qp, &wr, &bad);
}

int shmem_get(void *dest, const void *src, size_t len, int pe)
{
	struct shmem_peer *p = &shm.peers[pe];
	struct ibv_sge sge = { (uintptr_t)shm.get_bounce, (uint32_t)len, shm.get_bounce_mr->lkey };
	struct ibv_send_wr wr = { 0 }, *bad;

	if (len > SHMEM_GET_BOUNCE)
		return -EINVAL;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = p->heap_base + ((const char *)src - shm.heap_base);
	wr.wr.rdma.rkey = p->heap_rkey;
	/* OK: rdma-access-flags-transport -- READ into a local-write-only bounce, but only InfiniBand devices are opened */
	if (ibv_post_send(p->qp, &wr, &bad))
		return -EIO;
	shm.outstanding++;
	shmem_quiet();
	memcpy(dest, shm.get_bounce, len);
	return 0;
}

void shmem_quiet(void)
{
	struct ibv_wc wc[32];
	int n;

	while (shm.outstanding) {
		n = ibv_poll_cq(shm.cq, 32, wc);
		if (n < 0)
			break;
		shm.outstanding -= n;
	}
	while (shm.tmp_regs) {
		struct shmem_tmp_reg *t = shm.tmp_regs;

		shm.tmp_regs = t->next;
		ibv_dereg_mr(t->mr);	// BUG: rdma-registration-in-datapath -- the per-put registrations are dropped at every quiet
		free(t);
	}
}

uint64_t shmem_atomic_fetch_add(uint64_t *dest, uint64_t value, int pe)
{
	struct shmem_peer *p = &shm.peers[pe];
	struct ibv_sge sge = { (uintptr_t)&shm.scratch[pe], sizeof(uint64_t), shm.scratch_mr->lkey };
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.atomic.remote_addr = p->heap_base + ((char *)dest - shm.heap_base);
	wr.wr.atomic.rkey = p->heap_rkey;
	wr.wr.atomic.compare_add = value;
	if (ibv_post_send(p->qp, &wr, &bad))
		return 0;
	shm.outstanding++;
	shmem_quiet();
	return shm.scratch[pe];
}

int shmem_barrier_notify(int pe, uint32_t phase)
{
	struct ibv_sge sge = { (uintptr_t)&phase, sizeof(phase), 0 };
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_INLINE }, *bad;

	return ibv_post_send(shm.peers[pe].ctrl_qp, &wr, &bad);
}

void shmem_transport_fini(void)
{
	shmem_quiet();
	free(shm.heap_base);	// BUG: rdma-invalidation-leak -- the heap goes back to the allocator while its remotely writable registration is still alive
	ibv_dereg_mr(shm.heap_mr);
	ibv_dereg_mr(shm.scratch_mr);
	/* OK: rdma-invalidation-leak -- scratch is freed only after its registration is gone */
	free(shm.scratch);
	ibv_dereg_mr(shm.get_bounce_mr);
	free(shm.get_bounce);
	ibv_dereg_mr(shm.ctrl_ring_mr);
	free(shm.ctrl_ring);
}
