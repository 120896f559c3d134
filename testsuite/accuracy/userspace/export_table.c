/*
 * xtab: an export table for a distributed shared-memory runtime.  Each
 * exported object gets its own MR, with rights built from the export's
 * options over several statements, and the (addr, rkey) pair is published
 * in the directory.
 *
 * Not correct: xtab_export() adds LOCAL_WRITE only when the export asks
 * for local fill; a writable export without local fill registers
 * REMOTE_WRITE without LOCAL_WRITE and fails.
 * Correct: xtab_export_scratch() ties LOCAL_WRITE to REMOTE_WRITE, and
 * the read-only-or-shared ternary of xtab_export_mirror() includes it on
 * both arms.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define XTAB_REMOTE_RW	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

struct xtab_opts {
	bool writable;
	bool atomics;
	bool local_fill;
	bool read_only;
};

struct xtab_entry {
	void          *obj;
	size_t         len;
	struct ibv_mr *mr;
};

/* publishes (addr, rkey) in the cluster directory */
extern int xdir_publish(const char *name, uint64_t addr, uint32_t rkey, size_t len);

int xtab_export(struct ibv_pd *pd, struct xtab_entry *e, const char *name,
		const struct xtab_opts *o)
{
	int flags = IBV_ACCESS_REMOTE_READ;

	if (o->writable)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	if (o->atomics)
		flags |= IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
	if (o->local_fill)
		flags |= IBV_ACCESS_LOCAL_WRITE;
	// BUG: rdma-access-flags-invalid -- writable, non-atomic, no local fill: REMOTE_WRITE without LOCAL_WRITE on that path
	e->mr = ibv_reg_mr(pd, e->obj, e->len, flags); // BUG: rdma-local-mr-management -- rkey published for peers
	if (!e->mr)
		return -errno;
	if (xdir_publish(name, (uintptr_t)e->obj, e->mr->rkey, e->len)) {
		/* OK: rdma-mr-leak -- released when publishing fails */
		ibv_dereg_mr(e->mr);
		e->mr = NULL;
		return -EIO;
	}
	return 0;
}

int xtab_export_scratch(struct ibv_pd *pd, struct xtab_entry *e, const char *name,
			bool writable)
{
	unsigned int flags = IBV_ACCESS_REMOTE_READ;

	if (writable)
		flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE comes with REMOTE_WRITE */
	e->mr = ibv_reg_mr(pd, e->obj, e->len, flags); // BUG: rdma-local-mr-management -- rkey published for peers
	if (!e->mr)
		return -errno;
	if (xdir_publish(name, (uintptr_t)e->obj, e->mr->rkey, e->len)) {
		ibv_dereg_mr(e->mr);
		e->mr = NULL;
		return -EIO;
	}
	return 0;
}

int xtab_export_mirror(struct ibv_pd *pd, struct xtab_entry *e, const char *name,
		       const struct xtab_opts *o)
{
	/* OK: rdma-access-flags-invalid -- both arms are valid */
	e->mr = ibv_reg_mr(pd, e->obj, e->len, // BUG: rdma-local-mr-management -- rkey published for peers
			   o->read_only ? IBV_ACCESS_REMOTE_READ : XTAB_REMOTE_RW);
	if (!e->mr)
		return -errno;
	if (xdir_publish(name, (uintptr_t)e->obj, e->mr->rkey, e->len)) {
		ibv_dereg_mr(e->mr);
		e->mr = NULL;
		return -EIO;
	}
	return 0;
}
