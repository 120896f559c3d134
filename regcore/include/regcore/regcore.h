/*
 * regcore - a core-managed RDMA registration layer for userspace ULPs.
 *
 * ULPs hand regcore scatter/gather lists and get RDMA READ/WRITE done
 * (regcore_rw_ctx_*), or get a remote key for a buffer and give it back
 * (regcore_reg_ctx_*). They never see local registration, the extra work
 * requests, or invalidation. See docs/regcore.md.
 *
 * Conventions:
 *  - Every function that can fail returns 0 (or a documented non-negative
 *    count) on success and a negative errno value on failure, e.g. -EAGAIN.
 *    regcore_last_error() returns a message for the last failure of the
 *    calling thread.
 *  - A struct regcore is shared by threads: every call may run
 *    concurrently, except on the same context, and a QP may not be
 *    destroyed while another thread uses it. Calls on one QP serialize on
 *    that QP's lock; different QPs run in parallel.
 *  - Cached registrations never outlive the memory they cover: memory
 *    events (munmap, mremap, madvise, brk) are monitored with userfaultfd;
 *    memory that is not monitored is not cached: each regcore_mr_get
 *    registers it and the last regcore_mr_put deregisters it.
 *  - The ULP must pass every completion of a QP created by regcore through
 *    regcore_poll_cq() or regcore_process_wc(): regcore consumes its own
 *    internal completions there and restores the ULP's wr_id on the one
 *    completion each context produces.
 */
#ifndef REGCORE_REGCORE_H
#define REGCORE_REGCORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REGCORE_VERSION_MAJOR 0
#define REGCORE_VERSION_MINOR 2

struct regcore;
struct regcore_rw_ctx;
struct regcore_reg_ctx;
struct rdma_cm_id;

/* ------------------------------------------------------------------ */
/* Core instance and declared budgets                                  */
/* ------------------------------------------------------------------ */

enum regcore_flags {
	/* Use the device's MR strategy for every rw context, even when the
	 * SGE list would fit (like the kernel's ib_core.force_mr). */
	REGCORE_F_FORCE_MR = 1 << 0,
	/* Never use memory windows for reg contexts; use per-context MRs. */
	REGCORE_F_NO_MW = 1 << 1,
	/* Do not monitor memory events (also: REGCORE_MONITOR=off in the
	 * environment). The cache then caches nothing: every regcore_mr_get
	 * registers, the last regcore_mr_put deregisters. */
	REGCORE_F_NO_MONITOR = 1 << 2,
	/* Do not MADV_DONTFORK cached ranges when ibv_is_fork_initialized()
	 * reports IBV_FORK_DISABLED. */
	REGCORE_F_NO_FORK_PROTECT = 1 << 3,
};

/* Per-consumer resource budget. Budgets are declared, never guessed:
 * max_ctxs is mandatory. Zero in the other fields selects the default. */
struct regcore_attr {
	uint32_t comp_mask;	    /* reserved, must be 0 */
	uint32_t flags;		    /* enum regcore_flags */
	uint32_t max_ctxs;	    /* rw + reg contexts alive at once, all QPs */
	uint32_t max_mrs;	    /* per-context registrations held at once
				       (MWs, indirect mkeys, staging or
				       per-context MRs); default max_ctxs,
				       or max_ctxs * max_sge_per_ctx where
				       every run may need its own MR (iWARP,
				       REGCORE_F_FORCE_MR) */
	uint32_t max_sge_per_ctx;   /* SGEs in one rw context; default 16 */
	uint32_t cache_max_entries; /* registration cache entries; default 1024 */
	uint64_t cache_max_bytes;   /* bytes the cache may keep registered;
				       default 1 GiB */
	uint32_t stage_bytes;	    /* staging MR size for REGCORE_RW_MR_STAGED;
				       default from the policy table */
	uint8_t port_num;	    /* default 1 */
};

int regcore_open(struct ibv_pd *pd, const struct regcore_attr *attr,
		 struct regcore **out);
/* -EBUSY while contexts, regcore QPs or ULP cache references are alive. */
int regcore_close(struct regcore *core);

/* Puts another protection domain (of the same or another device) behind
 * the core: its QPs share the core's budgets and registration cache.
 * -EEXIST if already added, -ENOSPC beyond 16 domains. */
int regcore_add_pd(struct regcore *core, struct ibv_pd *pd);

enum regcore_monitor {
	REGCORE_MONITOR_NONE = 0,	 /* unreferenced registrations dropped */
	REGCORE_MONITOR_USERFAULTFD = 1, /* memory events via userfaultfd */
};
/* How the cache learns that memory went away; *why (may be NULL) explains
 * REGCORE_MONITOR_NONE (disabled, kernel refused, forked child). */
int regcore_monitor_state(const struct regcore *core, const char **why);

/* Message for the last failure on this thread ("" if none). */
const char *regcore_last_error(void);
/* strerror() for regcore return codes (accepts negative values). */
const char *regcore_strerror(int err);

/* ------------------------------------------------------------------ */
/* Transport-independent access flags                                 */
/* ------------------------------------------------------------------ */

/* What a buffer is used for; combine with |. */
enum regcore_role {
	REGCORE_ROLE_SEND_SOURCE = 1 << 0,    /* SEND / RDMA WRITE source */
	REGCORE_ROLE_RECV_SINK = 1 << 1,      /* RECV buffer */
	REGCORE_ROLE_READ_SINK = 1 << 2,      /* local sink of an RDMA READ */
	REGCORE_ROLE_REMOTE_READ = 1 << 3,    /* the peer RDMA READs it */
	REGCORE_ROLE_REMOTE_WRITE = 1 << 4,   /* the peer RDMA WRITEs it */
	REGCORE_ROLE_REMOTE_ATOMIC = 1 << 5,  /* the peer runs atomics on it */
	REGCORE_ROLE_MW_BIND = 1 << 6,	      /* memory windows bind to it */
};

/* ibv_access_flags for `roles` on this core's device: LOCAL_WRITE whenever
 * REMOTE_WRITE or REMOTE_ATOMIC is set, REMOTE_WRITE for READ sinks on
 * iWARP. Returns the flags (>= 0) or -EINVAL for unknown role bits. */
int regcore_access_flags(const struct regcore *core, unsigned roles);
/* Same rule without a core, from the transport alone. */
int regcore_access_flags_for(enum ibv_transport_type transport,
			     unsigned roles);

/* ------------------------------------------------------------------ */
/* Policy: the decision table (see docs/regcore.md)                    */
/* ------------------------------------------------------------------ */

enum regcore_dir {
	REGCORE_DIR_READ = 1,  /* RDMA READ: remote -> local sink */
	REGCORE_DIR_WRITE = 2, /* RDMA WRITE: local source -> remote */
};

enum regcore_rw_strategy {
	REGCORE_RW_SINGLE_WR = 1, /* one RDMA WR over cached lkeys */
	REGCORE_RW_MULTI_WR = 2,  /* several RDMA WRs, max_sge(dir) each */
	REGCORE_RW_MR_STAGED = 3, /* per-context pre-registered MR, 1 WR,
				     data staged through it */
	REGCORE_RW_MR_REG = 4,	  /* per-context MRs with exactly the rights
				     the I/O needs, deregistered on destroy */
	REGCORE_RW_INDIRECT = 5,  /* mlx5dv indirect mkey: UMR + 1 RDMA WR */
};

enum regcore_reg_strategy {
	REGCORE_REG_MW = 1,	  /* type-2 memory window bound by a WR */
	REGCORE_REG_MR = 2,	  /* per-context MR, deregistered on release */
	REGCORE_REG_INDIRECT = 3, /* mlx5dv indirect mkey over an SGL (UMR) */
	REGCORE_REG_STAGED = 4,	  /* SGL staged through a bounce buffer keyed
				     by a window or a per-context MR */
};

/* The row of the decision table that matched this device, with the
 * device limits that feed the decisions. */
struct regcore_policy {
	const char *device_class;  /* "iwarp", "mlx5", "mlx4", "mthca", "generic" */
	enum ibv_transport_type transport;
	uint32_t max_sge_write;	   /* SGEs per RDMA WRITE WR */
	uint32_t max_sge_read;	   /* SGEs per RDMA READ WR (max_sge_rd) */
	uint32_t max_sge_per_ctx;  /* declared */
	uint32_t wrs_per_ctx;	   /* worst-case send WRs of one context */
	uint32_t stage_bytes;	   /* MR_STAGED threshold (0: not used) */
	unsigned read_sink_access; /* access flags of READ sinks */
	enum regcore_rw_strategy beyond_sge_read;  /* READ that does not fit */
	enum regcore_rw_strategy beyond_sge_write; /* WRITE that does not fit */
	int read_always_mr;	   /* READ sinks always get a per-context MR */
	int indirect;		   /* indirect mkeys usable */
	enum regcore_reg_strategy reg_strategy;
};

int regcore_policy_get(const struct regcore *core, struct regcore_policy *out);
/* The policy of another domain of the core (regcore_add_pd). */
int regcore_policy_get_pd(const struct regcore *core, struct ibv_pd *pd,
			  struct regcore_policy *out);

/* Strategy the table picks for an I/O of `runs` SGEs (after coalescing) and
 * `bytes` bytes. Pure function of the policy; regcore_rw_ctx_init uses it. */
enum regcore_rw_strategy regcore_policy_decide(const struct regcore_policy *p,
					       enum regcore_dir dir,
					       unsigned runs, uint64_t bytes,
					       unsigned flags);

/* Dry run of regcore_rw_ctx_init's choice for this SGE list. */
int regcore_rw_strategy_for(const struct regcore *core, enum regcore_dir dir,
			    const struct ibv_sge *sgl, unsigned nsge,
			    enum regcore_rw_strategy *out);

/* Writes the whole decision table (all device classes) and, if core is not
 * NULL, the row selected for its device. Returns the length that the full
 * text needs (like snprintf) or a negative errno. */
int regcore_policy_describe(const struct regcore *core, char *buf, size_t len);

const char *regcore_rw_strategy_name(enum regcore_rw_strategy s);
const char *regcore_reg_strategy_name(enum regcore_reg_strategy s);

/* ------------------------------------------------------------------ */
/* Queue pairs sized by the core                                        */
/* ------------------------------------------------------------------ */

/* Send queue depth (and send CQ entries) for a QP carrying ulp_send_wr WRs
 * of the ULP's own plus max_rdma_ctxs contexts. -EOVERFLOW on overflow. */
int regcore_max_send_wr(const struct regcore *core, uint32_t ulp_send_wr,
			uint32_t max_rdma_ctxs, uint32_t *out);

/* Creates an RC QP on the core's PD. attr->cap.max_send_wr is the ULP's own
 * share; regcore grows it by wrs_per_ctx * max_rdma_ctxs, raises
 * max_send_sge/max_inline_data as its strategies need, and writes the
 * actual caps back into attr->cap. Fails with
 *   -EINVAL  sq_sig_all set (internal WRs must stay unsignaled), not RC,
 *            max_rdma_ctxs == 0
 *   -ENOSPC  device max_qp_wr cannot hold the queue, the send CQ has fewer
 *            entries than the queue, or the core's max_ctxs budget is
 *            already declared by other QPs
 * and never silently clamps. */
int regcore_qp_create(struct regcore *core, struct ibv_qp_init_attr *attr,
		      uint32_t max_rdma_ctxs, struct ibv_qp **out);
int regcore_qp_create_ex(struct regcore *core,
			 struct ibv_qp_init_attr_ex *attr,
			 uint32_t max_rdma_ctxs, struct ibv_qp **out);
/* -EBUSY while a posted rw context of this QP has not completed. Reg
 * contexts still holding a key are invalidated synchronously. Adopted QPs
 * are released, not destroyed (their owner destroys them afterwards). */
int regcore_qp_destroy(struct regcore *core, struct ibv_qp *qp);

/* QPs created elsewhere (rdma_create_qp, a provider's own call):
 * regcore_qp_init_attr grows attr->cap for max_rdma_ctxs contexts on pd (one
 * of the core's, NULL: the first) like regcore_qp_create does, with the same
 * refusals; create the QP with it, then adopt it. Adoption checks the QP
 * (RC, sq_sig_all off, one of the core's PDs, send queue and send CQ deep
 * enough); such QPs cannot post mlx5 UMRs, so their I/Os use the device's
 * strategies without indirect mkeys. */
int regcore_qp_init_attr(const struct regcore *core, struct ibv_pd *pd,
			 struct ibv_qp_init_attr *attr, uint32_t max_rdma_ctxs);
int regcore_qp_adopt(struct regcore *core, struct ibv_qp *qp,
		     uint32_t max_rdma_ctxs);
/* rdma_cm: sizes attr, calls rdma_create_qp_ex(id, attr) and adopts
 * id->qp. The PD is attr->pd (IBV_QP_INIT_ATTR_PD), else id->pd, and must
 * be one of the core's. Release with regcore_qp_destroy, then
 * rdma_destroy_qp. -EOPNOTSUPP when regcore was built without librdmacm. */
int regcore_qp_create_cm(struct regcore *core, struct rdma_cm_id *id,
			 struct ibv_qp_init_attr_ex *attr,
			 uint32_t max_rdma_ctxs);

/* ------------------------------------------------------------------ */
/* Completions                                                          */
/* ------------------------------------------------------------------ */

/* ibv_poll_cq() that consumes regcore's internal completions and returns
 * only the ULP's (>= 0), or a negative errno. */
int regcore_poll_cq(struct regcore *core, struct ibv_cq *cq, int num_entries,
		    struct ibv_wc *wc);
/* For ULPs with their own poll loop: returns 1 if *wc is for the ULP (its
 * wr_id restored), 0 if regcore consumed it. */
int regcore_process_wc(struct regcore *core, struct ibv_wc *wc);

/* ------------------------------------------------------------------ */
/* RDMA READ/WRITE contexts (the kernel's rdma_rw)                       */
/* ------------------------------------------------------------------ */

/* SGEs with lkey == 0 are registered through the core's cache; others are
 * used as given. Adjacent SGEs are coalesced. Returns the number of send
 * WRs the context will post (> 0), or
 *   -EAGAIN  context or registration budget exhausted (retry after a
 *            completion)
 *   -E2BIG   more SGEs than the declared max_sge_per_ctx
 *   -EINVAL  bad arguments, QP not created by regcore_qp_create */
int regcore_rw_ctx_init(struct regcore_rw_ctx **ctx, struct regcore *core,
			struct ibv_qp *qp, const struct ibv_sge *sgl,
			unsigned nsge, uint64_t remote_addr, uint32_t rkey,
			enum regcore_dir dir);

/* Posts the context's WRs in one chain. Internal WRs are unsignaled; the
 * last one is signaled with wr_id, or, if chain_wr is given, chain_wr is
 * posted after them and its last WR must be signaled (its completion is the
 * context's completion and keeps the ULP's wr_id). -EAGAIN if the QP has no
 * room for the context (nothing posted). If the provider accepted only part
 * of the chain, regcore moves the QP to the error state so that every WR
 * flushes, and returns the provider's error. */
int regcore_rw_ctx_post(struct regcore_rw_ctx *ctx, struct ibv_qp *qp,
			uint64_t wr_id, struct ibv_send_wr *chain_wr);

/* -EBUSY if posted and the completion has not been seen yet. */
int regcore_rw_ctx_destroy(struct regcore_rw_ctx *ctx);

enum regcore_rw_strategy regcore_rw_ctx_strategy(const struct regcore_rw_ctx *ctx);
/* Keys of this context that grant remote access (only REGCORE_RW_MR_REG
 * READ sinks on iWARP have any). Returns the count, fills up to max. */
int regcore_rw_ctx_remote_keys(const struct regcore_rw_ctx *ctx,
			       uint32_t *keys, unsigned max);

/* ------------------------------------------------------------------ */
/* Remote registration contexts for initiators                          */
/* ------------------------------------------------------------------ */

/* Called once, from regcore_poll_cq/regcore_process_wc, when a release that
 * returned -EINPROGRESS finished: the key is dead and the buffer is the
 * ULP's again. status is 0 (the key is always dead by then). */
typedef void (*regcore_release_cb)(struct regcore_reg_ctx *ctx, int status,
				   void *arg);

/* Gives [addr, addr+length) a fresh remote key with `remote_access`
 * (IBV_ACCESS_REMOTE_READ and/or IBV_ACCESS_REMOTE_WRITE). */
int regcore_reg_ctx_init(struct regcore_reg_ctx **ctx, struct regcore *core,
			 struct ibv_qp *qp, void *addr, size_t length,
			 unsigned remote_access);

/* One key for a scatter/gather list, as NVMe-oF or iSER initiators
 * advertise in a keyed SGL: the peer addresses the elements as one
 * contiguous range. mlx5: an indirect mkey with remote access (zero based:
 * remote address 0). Elsewhere, a list that is contiguous once coalesced
 * gets a window or MR like regcore_reg_ctx_init; others are staged through
 * a bounce buffer of up to stage_bytes (default 64 KiB) keyed by a window
 * or a per-context MR: REMOTE_READ data is copied in at post, REMOTE_WRITE
 * data copied out before release hands the buffers back. -E2BIG beyond
 * max_sge_per_ctx elements or the bounce buffer. */
int regcore_reg_ctx_init_iov(struct regcore_reg_ctx **ctx, struct regcore *core,
			     struct ibv_qp *qp, const struct iovec *iov,
			     unsigned iovcnt, unsigned remote_access);

/* The key and address to advertise to the peer. */
int regcore_reg_ctx_rkey(const struct regcore_reg_ctx *ctx, uint32_t *rkey,
			 uint64_t *remote_addr);

/* Posts the key's registration (a BIND_MW WR when a window is used) followed
 * by chain_wr (typically the SEND carrying the rkey; its last WR must be
 * signaled). With chain_wr == NULL the registration is signaled and regcore
 * consumes its completion. */
int regcore_reg_ctx_post(struct regcore_reg_ctx *ctx,
			 struct ibv_send_wr *chain_wr);

/* Ends the peer's access. invalidated_rkey is wc.invalidated_rkey of the
 * response when (wc_flags & IBV_WC_WITH_INV), else 0. If it matches, the
 * peer already invalidated the key; otherwise regcore invalidates it
 * (LOCAL_INV, or freeing the window if the QP is in error). Returns
 *   0             key dead, buffer handed back now (cb not called)
 *   -EINPROGRESS  invalidation in flight; cb runs once when it completed
 * Key mismatches are counted and reported by regcore_last_error(). */
int regcore_reg_ctx_release(struct regcore_reg_ctx *ctx,
			    uint32_t invalidated_rkey, regcore_release_cb cb,
			    void *arg);

enum regcore_reg_strategy regcore_reg_ctx_strategy(const struct regcore_reg_ctx *ctx);
/* 1 if the peer may end the access with SEND_WITH_INV (windows, also over
 * a bounce buffer, and mlx5 indirect mkeys; not private MRs). */
int regcore_reg_ctx_remote_inv_ok(const struct regcore_reg_ctx *ctx);

/* ------------------------------------------------------------------ */
/* Registration cache                                                   */
/* ------------------------------------------------------------------ */

/* Cached registration. Read-only for the caller; the first fields mirror
 * struct ibv_mr so code written for ibv_reg_mr() keeps using mr->lkey. */
struct regcore_mr {
	void *addr;		/* start of the registered (page aligned) range */
	size_t length;
	uint32_t lkey;
	uint32_t rkey;
	unsigned access;	/* ibv_access_flags granted */
	struct ibv_mr *ibv_mr;
};

/* The replacement for ibv_reg_mr(pd, addr, length, access): returns a
 * referenced registration covering [addr, addr+length) with at least
 * `access` (LOCAL_WRITE added when REMOTE_WRITE/ATOMIC is asked). -ENOSPC if
 * the cache budget is full of referenced entries. On failure *mr is NULL and
 * errno is set, like ibv_reg_mr(), so `mr = ibv_reg_mr(pd, a, l, f);` becomes
 * `regcore_mr_get(core, a, l, f, &mr);` with the caller's checks unchanged. */
int regcore_mr_get(struct regcore *core, void *addr, size_t length,
		   unsigned access, struct regcore_mr **mr);
/* The same on another domain of the core. */
int regcore_mr_get_pd(struct regcore *core, struct ibv_pd *pd, void *addr,
		      size_t length, unsigned access, struct regcore_mr **mr);
int regcore_mr_put(struct regcore *core, struct regcore_mr *mr);
/* Drops every cached registration overlapping the range, so that later
 * gets register anew. The monitor does this by itself on munmap, mremap,
 * madvise(DONTNEED/FREE/REMOVE) and brk; memory it cannot watch is never
 * cached. Referenced entries are deregistered on their last put. */
int regcore_mr_invalidate_range(struct regcore *core, void *addr,
				size_t length);
uint32_t regcore_mr_lkey(const struct regcore_mr *mr);
uint32_t regcore_mr_rkey(const struct regcore_mr *mr);

/* ------------------------------------------------------------------ */
/* Statistics                                                           */
/* ------------------------------------------------------------------ */

struct regcore_stats {
	uint64_t rw_ctxs[6];		/* contexts initialized, by strategy */
	uint64_t reg_ctxs[5];		/* by reg strategy */
	uint64_t internal_wcs;		/* completions regcore consumed */
	uint64_t ulp_wcs;		/* completions handed to the ULP */
	uint64_t remote_inv_matched;
	uint64_t remote_inv_mismatched;
	uint64_t local_invs;		/* LOCAL_INV posted */
	uint64_t sync_invalidations;	/* keys killed by dealloc/dereg */
	uint64_t partial_posts;		/* chains the provider half accepted */
	uint64_t eagain;		/* budget/queue-room refusals */
	uint64_t cache_hits, cache_misses, cache_evictions;
	uint64_t cache_monitor_invalidations; /* entries dropped by memory events */
	uint64_t cache_unmonitored;	/* registrations not cached: no monitor, or
					   memory it cannot watch (file mappings) */
	uint32_t ctxs_in_use;
	uint32_t mrs_in_use;
};
int regcore_get_stats(const struct regcore *core, struct regcore_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* REGCORE_REGCORE_H */
