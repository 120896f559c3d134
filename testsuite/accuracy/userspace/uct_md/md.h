/*
 * uct_md: an InfiniBand memory domain split the UCX way: md_reg.c does the
 * registrations (mem_reg / mem_dereg, optional ODP, atomic-only regions),
 * md_rkey.c packs and unpacks remote keys for the wire.  The memory handle
 * is declared here so both files (and the transports) can use it.
 */
#ifndef UCT_MD_H
#define UCT_MD_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

enum {
	UCT_MD_MEM_FLAG_ATOMIC_ONLY = 1 << 0,
	UCT_MD_MEM_FLAG_ODP         = 1 << 1,
	UCT_MD_MEM_FLAG_LOCAL_ONLY  = 1 << 2,
};

typedef struct uct_ib_memh {
	void          *address;
	size_t         length;
	unsigned int   flags;
	struct ibv_mr *mr;
} uct_ib_memh_t;

typedef struct uct_ib_md {
	struct ibv_context *dev;
	struct ibv_pd      *pd;
	int                 odp_supported;
	int                 relaxed_order;
} uct_ib_md_t;

typedef struct uct_ib_packed_rkey {
	uint64_t address;
	uint32_t rkey;
	uint32_t flags;
} uct_ib_packed_rkey_t;

unsigned int uct_ib_md_access(const uct_ib_md_t *md, unsigned int mem_flags);
int uct_ib_mem_reg(uct_ib_md_t *md, void *address, size_t length, unsigned int flags,
		   uct_ib_memh_t **memh_p);
int uct_ib_mem_dereg(uct_ib_md_t *md, uct_ib_memh_t *memh);
int uct_ib_mkey_pack(const uct_ib_memh_t *memh, void *buf);

#endif
