/*
 * md_rkey.c: access rules and remote-key packing of the uct_md memory
 * domain.  Remote keys of every non-local-only region are packed into the
 * wire buffer the transports send to peers.
 *
 * Correct: LOCAL_WRITE accompanies every remote right; local-only regions
 * get no remote rights at all; ODP and relaxed ordering are added on top.
 */
#include "md.h"

unsigned int uct_ib_md_access(const uct_ib_md_t *md, unsigned int mem_flags)
{
	unsigned int access = IBV_ACCESS_LOCAL_WRITE;

	if (!(mem_flags & UCT_MD_MEM_FLAG_LOCAL_ONLY))
		access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_ATOMIC;
	if ((mem_flags & UCT_MD_MEM_FLAG_ODP) && md->odp_supported)
		access |= IBV_ACCESS_ON_DEMAND;
	if (md->relaxed_order)
		access |= IBV_ACCESS_RELAXED_ORDERING;
	return access;
}

int uct_ib_mkey_pack(const uct_ib_memh_t *memh, void *buf)
{
	uct_ib_packed_rkey_t *p = buf;

	if (memh->flags & UCT_MD_MEM_FLAG_LOCAL_ONLY)
		return -1;
	p->address = (uintptr_t)memh->address;
	p->rkey = memh->mr->rkey;
	p->flags = memh->flags;
	return (int)sizeof(*p);
}
