/*
 * simverbs - an in-process software RDMA device behind the real rdma-core
 * headers. Link a program against simverbs instead of -libverbs: it defines
 * the libibverbs (and the mlx5dv indirect-mkey) entry points and the ops
 * tables that the header's inline functions dispatch to.
 *
 * Model (docs/regcore.md, "simverbs"):
 *  - Work requests are queued at post time and executed when a CQ attached
 *    to the QP is polled (or simverbs_progress runs), at most
 *    exec_budget WQEs per call, in order.
 *  - A send WQE occupies the send queue until a completion at or after it
 *    is polled; unsignaled WQEs are retired by a later signaled one.
 *    ibv_post_send fails with ENOMEM when max_send_wr WQEs are outstanding.
 *  - Any error completion moves the QP to the error state; outstanding WQEs
 *    then complete with IBV_WC_WR_FLUSH_ERR (unsignaled ones too unless
 *    simverbs_set_flush_unsignaled(0)).
 *  - Keys are (index << 8 | tag). Remote access checks the key, the rights,
 *    the bounds, the PD and, for type-2 windows, the QP it was bound on.
 *  - An MR pins its pages: when the process unmaps or drops them (munmap,
 *    mremap, madvise(MADV_DONTNEED/REMOVE), mmap(MAP_FIXED) over them), the
 *    device keeps the content they had then and keeps using it, as hardware
 *    keeps DMAing to the pinned pages. ibv_reg_mr over unmapped memory
 *    fails with EFAULT.
 *  - Registration costs what simverbs_set_reg_cost() says (default: free).
 */
#ifndef SIMVERBS_SIMVERBS_H
#define SIMVERBS_SIMVERBS_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

enum simverbs_profile {
	SIMVERBS_PROFILE_MTHCA = 0, /* IB, small max_sge_rd, no windows */
	SIMVERBS_PROFILE_MLX4 = 1,  /* IB, type-2 windows */
	SIMVERBS_PROFILE_MLX5 = 2,  /* IB, type-2 windows, mlx5dv mkeys */
	SIMVERBS_PROFILE_IWARP = 3, /* iWARP, max_sge_rd 1, READ sink needs
				       REMOTE_WRITE, no windows */
	SIMVERBS_PROFILE_COUNT = 4,
};

/* Selects the device that ibv_get_device_list() returns from now on.
 * Without a call, the SIMVERBS_PROFILE environment variable (mthca, mlx4,
 * mlx5, iwarp, or all) decides; default mlx5. */
int simverbs_set_profile(enum simverbs_profile profile);
int simverbs_set_profile_by_name(const char *name); /* also "all" */
const char *simverbs_profile_name(enum simverbs_profile profile);
int simverbs_profile_from_name(const char *name); /* -EINVAL if unknown */

/* ---- execution model ---- */

/* WQEs executed per poll/progress call across all QPs; 0 = unlimited. */
void simverbs_set_exec_budget(unsigned wqes);
/* 1 (default): flushed unsignaled WQEs produce a FLUSH_ERR completion. */
void simverbs_set_flush_unsignaled(int on);
/* Executes up to `budget` pending WQEs of every QP of the context
 * (0 = all). Returns how many ran. */
int simverbs_progress(struct ibv_context *ctx, unsigned budget);

/* ---- fault injection (one-shot, relative to now) ---- */

enum simverbs_fault_kind {
	/* The `after`-th WR posted from now is rejected by ibv_post_send /
	 * ibv_wr_complete with errno `code` (WRs before it in the same list
	 * are posted, like hardware). */
	SIMVERBS_FAULT_POST_FAIL = 0,
	/* The `after`-th WQE executed from now completes with wc status
	 * `code`; the QP moves to the error state. */
	SIMVERBS_FAULT_ERROR_CQE = 1,
	/* Before the `after`-th WQE executed from now, its QP moves to the
	 * error state (everything outstanding flushes). */
	SIMVERBS_FAULT_QP_ERROR = 2,
};
int simverbs_fault_inject(enum simverbs_fault_kind kind, uint64_t after,
			  int code);
void simverbs_fault_clear(void);

/* ---- statistics ---- */

struct simverbs_stats {
	uint64_t posted_wrs;
	uint64_t executed_wqes;
	uint64_t completions;
	uint64_t flushed_wqes;
	uint64_t post_enomem;	     /* send queue overflow (not injected) */
	uint64_t post_einval;	     /* malformed WR (not injected) */
	uint64_t injected_post_failures;
	uint64_t injected_error_cqes;
	uint64_t injected_qp_errors;
	uint64_t cq_overflows;
	uint64_t local_errors;	     /* local protection/length/bind errors */
	uint64_t remote_access_errors; /* rejected remote accesses */
	uint64_t max_sq_depth_seen;
	uint64_t registrations;	     /* ibv_reg_mr* that succeeded */
	uint64_t deregistrations;
	uint64_t detached_pages;     /* pinned pages the process let go of */
	uint64_t stale_accesses;     /* device accesses served from them */
};
void simverbs_get_stats(struct simverbs_stats *out);
void simverbs_reset_stats(void);
/* Description of the most recent error the device detected. */
const char *simverbs_last_error(void);

/* ---- registration cost and fork ---- */

/* Modelled CPU cost of registration, spent (busy-waiting, outside the
 * device's lock) in ibv_reg_mr* and ibv_dereg_mr: per call plus per 4 KiB
 * page. Real registration enters the kernel, pins every page and writes the
 * device's translation tables; simverbs does none of that. NULL or zeros:
 * free (the default). */
struct simverbs_reg_cost {
	uint32_t reg_ns;
	uint32_t reg_ns_per_page;
	uint32_t dereg_ns;
	uint32_t dereg_ns_per_page;
};
void simverbs_set_reg_cost(const struct simverbs_reg_cost *cost);

/* What ibv_is_fork_initialized() answers (default IBV_FORK_UNNEEDED, a
 * kernel that copies pinned pages at fork); ibv_fork_init() turns
 * DISABLED into ENABLED. simverbs itself never calls madvise. */
void simverbs_set_fork_status(enum ibv_fork_status status);

/* ---- QP helpers ---- */

/* Drives qp through INIT, RTR (dest_qp_num) and RTS. */
int simverbs_qp_connect(struct ibv_qp *qp, uint32_t dest_qp_num);
/* Outstanding (un-retired) send WQEs. */
unsigned simverbs_qp_sq_outstanding(struct ibv_qp *qp);

/* ---- the simulated peer ---- */

struct simverbs_peer;

/* A remote endpoint with its own memory and protection domain. */
struct simverbs_peer *simverbs_peer_create(struct ibv_context *ctx);
void simverbs_peer_destroy(struct simverbs_peer *peer);
uint32_t simverbs_peer_qp_num(const struct simverbs_peer *peer);
/* Connects qp to the peer (simverbs_qp_connect with the peer's number). */
int simverbs_peer_connect(struct simverbs_peer *peer, struct ibv_qp *qp);

/* Peer memory that the local QP's RDMA READ/WRITE WRs target. */
int simverbs_peer_expose(struct simverbs_peer *peer, void *buf, size_t len,
			 unsigned access, uint32_t *rkey);

/* Peer-initiated operations on the connected local QP. They return 0 or
 *   -ENOKEY   the key is unknown, stale, invalidated or unbound
 *   -EACCES   the key lacks the right
 *   -ERANGE   outside the key's bounds
 *   -EPERM    key of another PD, or a window bound on another QP
 *   -ENOTCONN no connected QP ready to receive
 *   -EAGAIN   (send) no receive WR posted (RNR)
 * Rejected accesses do not affect the local QP. */
int simverbs_peer_rdma_write(struct simverbs_peer *peer, uint32_t rkey,
			     uint64_t remote_addr, const void *src, size_t len);
int simverbs_peer_rdma_read(struct simverbs_peer *peer, uint32_t rkey,
			    uint64_t remote_addr, void *dst, size_t len);
/* SEND (invalidate_rkey == 0) or SEND_WITH_INV to the local QP. */
int simverbs_peer_send(struct simverbs_peer *peer, const void *buf, size_t len,
		       uint32_t invalidate_rkey);
/* Takes the oldest message the local QP sent to the peer. -EAGAIN if none. */
int simverbs_peer_recv(struct simverbs_peer *peer, void *buf, size_t cap,
		       size_t *len);

/* librdmacm subset, for programs built on rdma_cm: rdma_create_event_channel,
 * rdma_destroy_event_channel, rdma_create_id, rdma_destroy_id,
 * rdma_bind_addr and rdma_resolve_addr (any address: the id gets its own
 * context on the simverbs device, port 1), rdma_create_qp, rdma_create_qp_ex
 * (CQs created when not given) and rdma_destroy_qp. No connection
 * management: connect the QP with simverbs_peer_connect(). */

/* 0 if `key` currently grants any access in pd (rights in *access, may be
 * NULL), -ENOKEY otherwise. Independent of QP state and window binding QP. */
int simverbs_key_query(struct ibv_pd *pd, uint32_t key, unsigned *access);

#ifdef __cplusplus
}
#endif

#endif /* SIMVERBS_SIMVERBS_H */
