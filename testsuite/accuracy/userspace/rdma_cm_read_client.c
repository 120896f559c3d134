/*
 * rget: a file-fetch client on librdmacm.  The server publishes files in
 * a registered region and answers a LOOKUP with (addr, rkey, len); the
 * client pulls the bytes with rdma_post_read() into the caller's buffer,
 * which it registers for the duration of that one fetch with
 * rdma_reg_msgs() and deregisters when the READ completed.
 *
 * Not correct:
 *  - registration and deregistration run once per fetch (the buffer is
 *    the caller's, usually the same one every time: a registration cache
 *    would do);
 *  - rdma_reg_msgs() gives LOCAL_WRITE only, but the buffer is the sink of
 *    an RDMA READ; on iWARP the READ fails.
 * Correct: message buffers for LOOKUP/reply are registered once; every
 * work request is signaled and reaped.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct rget_lookup {
	char     name[120];
	uint64_t cookie;
};

struct rget_reply {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
	int32_t  status;
	uint32_t pad;
};

struct rget {
	struct rdma_cm_id  *id;
	struct rget_lookup  req;
	struct rget_reply   rep;
	struct ibv_mr      *req_mr, *rep_mr;
};

int rget_setup_msgs(struct rget *g)
{
	/* OK: rdma-local-mr-management -- message buffers registered once, local access */
	g->req_mr = rdma_reg_msgs(g->id, &g->req, sizeof(g->req));
	if (!g->req_mr)
		return -errno;
	/* OK: rdma-local-mr-management -- message buffers registered once, local access */
	g->rep_mr = rdma_reg_msgs(g->id, &g->rep, sizeof(g->rep));
	if (!g->rep_mr) {
		rdma_dereg_mr(g->req_mr);
		return -errno;
	}
	return 0;
}

static int rget_lookup(struct rget *g, const char *name)
{
	struct ibv_wc wc;

	strncpy(g->req.name, name, sizeof(g->req.name) - 1);
	if (rdma_post_recv(g->id, NULL, &g->rep, sizeof(g->rep), g->rep_mr))
		return -EIO;
	if (rdma_post_send(g->id, NULL, &g->req, sizeof(g->req), g->req_mr, IBV_SEND_SIGNALED))
		return -EIO;
	if (rdma_get_send_comp(g->id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	if (rdma_get_recv_comp(g->id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	return (int32_t)be32toh((uint32_t)g->rep.status);
}

ssize_t rget_fetch(struct rget *g, const char *name, void *buf, size_t cap)
{
	struct ibv_mr *mr;
	struct ibv_wc wc;
	uint32_t len;
	int ret;

	ret = rget_lookup(g, name);
	if (ret)
		return ret;
	len = be32toh(g->rep.len);
	if (len > cap)
		return -ENOSPC;

	mr = rdma_reg_msgs(g->id, buf, len); // BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the destination is registered for every fetch
	if (!mr)
		return -errno;
	ret = rdma_post_read(g->id, NULL, buf, len, mr, IBV_SEND_SIGNALED, // BUG: rdma-access-flags-transport -- READ sink registered LOCAL_WRITE only (rdma_reg_msgs); fails on iWARP
			     be64toh(g->rep.addr), be32toh(g->rep.rkey));
	if (!ret && (rdma_get_send_comp(g->id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS))
		ret = -EIO;
	/* OK: rdma-mr-leak -- deregistered on success and failure */
	rdma_dereg_mr(mr); // BUG: rdma-registration-in-datapath -- deregistration once per fetch
	return ret ? ret : (ssize_t)len;
}
