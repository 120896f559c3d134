/*
 * fetchc: client of a "fetch into my buffer" RPC.  For every fetch the
 * client registers the destination buffer with REMOTE_WRITE (buffers come
 * from the application and change on every call), sends the server
 * (addr, rkey, len), and waits for the DONE message; the server
 * RDMA-WRITEs the data in between.  On DONE the MR is deregistered, which
 * kills the key, and the request is freed.
 *
 * Not correct: when the server does not answer within the deadline, the
 * timeout path frees the request -- and the MR with it, still registered:
 * the key the server holds stays valid over the application's buffer, and
 * the MR leaks.  Registering per call is itself the per-I/O registration
 * the datapath check is about.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fetch_msg {
	uint64_t id;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
	char     path[128];
};

struct fetch_req {
	struct fetch_req *next;
	uint64_t          id;
	struct ibv_mr    *mr;
	struct fetch_msg  msg;
	time_t            deadline;
	void            (*cb)(struct fetch_req *, int);
};

struct fetchc {
	struct ibv_pd    *pd;
	struct ibv_qp    *qp;
	struct ibv_mr    *msg_mr;	/* covers the request pool */
	struct fetch_req *pending;
	uint64_t          next_id;
};

int fetchc_fetch(struct fetchc *c, struct fetch_req *r, const char *path, void *buf,
		 uint32_t len)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the destination is registered for every fetch
	r->mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!r->mr)
		return -errno;
	r->id = c->next_id++;
	r->msg.id = htobe64(r->id);
	r->msg.addr = htobe64((uintptr_t)buf);
	r->msg.rkey = htobe32(r->mr->rkey);
	r->msg.len = htobe32(len);
	strncpy(r->msg.path, path, sizeof(r->msg.path) - 1);

	sge.addr = (uintptr_t)&r->msg;
	sge.length = sizeof(r->msg);
	sge.lkey = c->msg_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)r;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_send(c->qp, &wr, &bad)) {
		/* OK: rdma-mr-leak, rdma-invalidation-leak -- deregistered on the failed post */
		ibv_dereg_mr(r->mr); // BUG: rdma-registration-in-datapath -- per-fetch deregistration
		r->mr = NULL;
		return -EIO;
	}
	r->deadline = time(NULL) + 5;
	r->next = c->pending;
	c->pending = r;
	return 0;
}

static void fetchc_unlink(struct fetchc *c, struct fetch_req *r)
{
	struct fetch_req **pp;

	for (pp = &c->pending; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			return;
		}
}

void fetchc_done(struct fetchc *c, struct ibv_wc *wc, uint64_t id, int status)
{
	struct fetch_req *r;

	(void)wc;
	for (r = c->pending; r; r = r->next)
		if (r->id == id)
			break;
	if (!r)
		return;
	fetchc_unlink(c, r);
	ibv_dereg_mr(r->mr); // BUG: rdma-registration-in-datapath -- per-fetch deregistration in the completion path
	r->cb(r, status);
	free(r);
}

void fetchc_expire(struct fetchc *c)
{
	time_t now = time(NULL);
	struct fetch_req *r, *next;

	for (r = c->pending; r; r = next) {
		next = r->next;
		if (r->deadline > now)
			continue;
		fetchc_unlink(c, r);
		r->cb(r, -ETIMEDOUT);
		free(r); // BUG: rdma-mr-leak, rdma-invalidation-leak -- r->mr (REMOTE_WRITE, key held by the server) is freed with its holder, never deregistered
	}
}
