/*
 * va_shmw.h - "shmw", a shared-memory-window service: a process lends
 * slices of a local arena to one peer through type-2 memory windows.
 *
 * va_shmw_expose.c sets the service up and maps regions (binds a window and
 * sends its descriptor to the peer); va_shmw_release.c takes them back
 * (UNMAP from the peer, lease expiry, local unmap, teardown).
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not the subject of this program
 */
#ifndef VA_SHMW_H
#define VA_SHMW_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#define SHMW_NR_REGIONS		32
#define SHMW_REGION_SIZE	(1u << 20)
#define SHMW_RX_DEPTH		32

enum shmw_msg_type {
	SHMW_MSG_MAP = 1,	/* us -> peer: descriptor of a mapped region */
	SHMW_MSG_RESIZE,	/* peer -> us: wants a larger region */
	SHMW_MSG_UNMAP,		/* peer -> us: done, sent with SEND_WITH_INV */
};

struct shmw_desc {
	uint32_t type;
	uint32_t region;
	uint64_t addr;
	uint64_t length;
	uint32_t rkey;
	uint32_t access;
};

struct shmw_region {
	struct shmw_region *next;
	struct ibv_mw *mw;
	uint32_t rkey;		/* key of the current binding */
	uint32_t idx;
	char *buf;		/* SHMW_REGION_SIZE slice of the arena */
	size_t length;
	unsigned int access;
	uint64_t lease_end;
	int mapped;
	struct shmw_desc desc;	/* sent inline */
};

struct shmw_rx {
	struct shmw_desc msg;
	unsigned int wc_flags;
	uint32_t inv_rkey;
	uint32_t byte_len;
};

struct shmw_ctx {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	char *arena;
	struct ibv_mr *arena_mr;
	struct shmw_region regions[SHMW_NR_REGIONS];
	struct shmw_region *free;
	struct shmw_rx *rx;
	struct ibv_mr *rx_mr;
	uint64_t lease_ns;
	int broken;
};

/* va_shmw_expose.c */
int shmw_ctx_init(struct shmw_ctx *ctx);
struct shmw_region *shmw_map(struct shmw_ctx *ctx, size_t length,
			     unsigned int access);
int shmw_resize(struct shmw_ctx *ctx, struct shmw_region *r, size_t length);
int shmw_post_rx(struct shmw_ctx *ctx, struct shmw_rx *rx);
uint64_t shmw_now_ns(void);

/* va_shmw_release.c */
void shmw_region_put(struct shmw_ctx *ctx, struct shmw_region *r);
int shmw_unmap(struct shmw_ctx *ctx, struct shmw_region *r);
void shmw_unmap_async(struct shmw_ctx *ctx, struct shmw_region *r);
void shmw_handle_recv(struct shmw_ctx *ctx, const struct ibv_wc *wc);
void shmw_expire(struct shmw_ctx *ctx);
void shmw_ctx_fini(struct shmw_ctx *ctx);

#endif /* VA_SHMW_H */
