/*
 * md_reg.c: registration side of the uct_md memory domain.
 *
 * Regular regions get their access from uct_ib_md_access() (md_rkey.c
 * owns the rules, next to the packing code).  Atomic-only regions (used by
 * the AMO transport for counters) are registered here with their own
 * flags.  ODP registrations are advised (prefetched) after registration.
 *
 * Not correct:
 *  - the atomic-only flags have REMOTE_ATOMIC without LOCAL_WRITE;
 *  - when the ODP prefetch fails, uct_ib_mem_reg() returns the error with
 *    the MR only held in a local variable.
 * Correct: mem_dereg deregisters before freeing the handle; the memh is
 * handed to the caller on success; this is the control path (a memory
 * domain call), not the I/O path.
 */
#include "md.h"

#include <errno.h>
#include <stdlib.h>

int uct_ib_mem_reg(uct_ib_md_t *md, void *address, size_t length, unsigned int flags,
		   uct_ib_memh_t **memh_p)
{
	uct_ib_memh_t *memh;
	struct ibv_mr *mr;
	unsigned int access;
	int ret;

	if (flags & UCT_MD_MEM_FLAG_ATOMIC_ONLY)
		access = IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ;
	else
		access = uct_ib_md_access(md, flags);

	// BUG: rdma-access-flags-invalid -- atomic-only regions get REMOTE_ATOMIC without LOCAL_WRITE
	mr = ibv_reg_mr(md->pd, address, length, access); // BUG: rdma-local-mr-management -- rkeys are packed for peers
	if (!mr)
		return -errno;

	if ((flags & UCT_MD_MEM_FLAG_ODP) && md->odp_supported) {
		struct ibv_sge sge = { (uintptr_t)address, (uint32_t)length, mr->lkey };

		ret = ibv_advise_mr(md->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				    IB_UVERBS_ADVISE_MR_FLAG_FLUSH, &sge, 1);
		if (ret)
			return -ret; // BUG: rdma-mr-leak -- 'mr' is still registered on this error return
	}

	memh = malloc(sizeof(*memh));
	if (!memh) {
		/* OK: rdma-mr-leak -- released before the error return */
		ibv_dereg_mr(mr);
		return -ENOMEM;
	}
	memh->address = address;
	memh->length = length;
	memh->flags = flags;
	memh->mr = mr;
	*memh_p = memh;
	/* OK: rdma-mr-leak -- the handle goes to the caller */
	return 0;
}

int uct_ib_mem_dereg(uct_ib_md_t *md, uct_ib_memh_t *memh)
{
	int ret;

	(void)md;
	ret = ibv_dereg_mr(memh->mr);
	if (ret)
		return -ret;	/* memh stays valid; caller may retry */
	/* OK: rdma-invalidation-leak -- deregistered (key dead) before the handle is freed */
	free(memh);
	return 0;
}
