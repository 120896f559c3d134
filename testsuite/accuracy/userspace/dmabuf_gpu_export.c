/*
 * gpucoll: buffer registration for a collective-communication library
 * that moves data directly between GPUs.  Device buffers are exported as
 * dma-buf file descriptors by the GPU runtime and registered with
 * ibv_reg_dmabuf_mr(); when the kernel or the NIC cannot do dma-buf, the
 * library falls back to a pinned host staging buffer registered zero-based
 * with ibv_reg_mr_iova2().  Either way the peer writes into the buffer, so
 * the (address, rkey) pair goes into the connection handshake.
 *
 * Correct: the staging registration carries LOCAL_WRITE with its remote
 * rights; both keys are sent to the peer; failures release what was
 * registered.
 * Not correct: the dma-buf registration asks for remote read/write
 * without local write, so it fails with EINVAL on every provider and the
 * library silently runs on the (slower) staging path.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GC_REMOTE_RW	(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

struct gc_handshake {
	uint64_t addr;
	uint32_t rkey;
	uint32_t zero_based;
	uint64_t len;
};

struct gc_buf {
	void          *dev_ptr;	/* GPU virtual address */
	size_t         len;
	int            dmabuf_fd;
	void          *staging;
	struct ibv_mr *mr;
	int            zero_based;
};

/* provided by the GPU runtime shim */
extern int gc_gpu_export_dmabuf(void *dev_ptr, size_t len, int *fd, uint64_t *offset);

static int gc_reg_dmabuf(struct ibv_pd *pd, struct gc_buf *b)
{
	uint64_t offset;
	int ret;

	ret = gc_gpu_export_dmabuf(b->dev_ptr, b->len, &b->dmabuf_fd, &offset);
	if (ret)
		return ret;
	// BUG: rdma-access-flags-invalid -- remote read/write without IBV_ACCESS_LOCAL_WRITE
	b->mr = ibv_reg_dmabuf_mr(pd, offset, b->len, (uintptr_t)b->dev_ptr, // BUG: rdma-local-mr-management -- rkey handed to the peer
				  b->dmabuf_fd, GC_REMOTE_RW | IBV_ACCESS_RELAXED_ORDERING);
	if (!b->mr) {
		close(b->dmabuf_fd);
		b->dmabuf_fd = -1;
		return -errno;
	}
	b->zero_based = 0;
	return 0;
}

static int gc_reg_staging(struct ibv_pd *pd, struct gc_buf *b)
{
	if (posix_memalign(&b->staging, 1 << 21, b->len))
		return -ENOMEM;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE accompanies the remote rights */
	b->mr = ibv_reg_mr_iova2(pd, b->staging, b->len, 0, // BUG: rdma-local-mr-management -- rkey handed to the peer
				 IBV_ACCESS_LOCAL_WRITE | GC_REMOTE_RW |
				 IBV_ACCESS_RELAXED_ORDERING);
	if (!b->mr) {
		free(b->staging);
		b->staging = NULL;
		return -errno;
	}
	b->zero_based = 1;
	return 0;
}

int gc_buf_register(struct ibv_pd *pd, struct gc_buf *b, struct gc_handshake *hs)
{
	int ret;

	b->dmabuf_fd = -1;
	ret = gc_reg_dmabuf(pd, b);
	if (ret)
		ret = gc_reg_staging(pd, b);
	if (ret)
		return ret;

	/* OK: rdma-remote-access-overbroad -- the key is sent to the peer in the handshake */
	hs->addr = htobe64(b->zero_based ? 0 : (uintptr_t)b->dev_ptr);
	hs->rkey = htobe32(b->mr->rkey);
	hs->zero_based = htobe32(b->zero_based);
	hs->len = htobe64(b->len);
	return 0;
}

void gc_buf_unregister(struct gc_buf *b)
{
	if (b->mr)
		ibv_dereg_mr(b->mr);
	b->mr = NULL;
	if (b->dmabuf_fd >= 0)
		close(b->dmabuf_fd);
	/* OK: rdma-invalidation-leak -- the staging buffer is freed after the MR is deregistered */
	free(b->staging);
	b->staging = NULL;
}
