/*
 * rpc_cm_server.c - blocking RPC server on librdmacm endpoints.
 *
 * Written in the style of the librdmacm example servers: one connection
 * at a time, rdma_create_ep()/rdma_get_request(), synchronous completions
 * with rdma_get_recv_comp().  Requests:
 *
 *   RPC_PUT    the client names a buffer (addr, rkey); the server pulls it
 *              with RDMA READ into its staging buffer
 *   RPC_STAT   small attribute pull straight into the request buffer
 *   RPC_GET    the server prepares the result in a buffer the client
 *              RDMA-READs, and hands out the buffer's rkey
 *   RPC_DONE   the client is finished with the last GET result
 *   RPC_STREAM the staging buffer is handed back chunk by chunk through
 *              one memory window; the client acks every chunk with
 *              SEND_WITH_INV of the window's rkey
 *
 * Replies are plain SENDs.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define RPC_MSG_SIZE        256
#define RPC_STAGING_SIZE    (1 << 20)
#define RPC_RECV_DEPTH      8192
#define RPC_RECV_SGE        16
#define RPC_STREAM_CHUNK    (64 * 1024)

enum { RPC_PUT = 1, RPC_STAT, RPC_GET, RPC_DONE, RPC_STREAM, RPC_QUIT };

struct rpc_msg {
	uint32_t op;
	uint32_t len;
	uint64_t addr;
	uint32_t rkey;
	uint32_t status;
	char     payload[RPC_MSG_SIZE - 24];
};

static struct rdma_cm_id *listen_id, *id;
static struct rpc_msg recv_msg, send_msg;
static struct ibv_mr *recv_mr, *send_mr, *staging_mr, *stats_mr;
static char *staging;
static uint64_t server_stats[64];

int rpc_build_result(const struct rpc_msg *req, char **buf, size_t *len);

static int rpc_ep_setup(struct rdma_addrinfo *res, uint32_t depth, uint32_t rsge)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = 16;
	attr.cap.max_recv_wr = depth;		// BUG(file): rdma-queue-cap-unchecked -- the caller asks for 8192 receives; max_qp_wr is never consulted
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = rsge;		// BUG(file): rdma-queue-cap-unchecked -- 16 receive SGEs requested without comparing with max_sge
	attr.cap.max_inline_data = 16;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;			// BUG(file): rdma-unsignaled-send-starvation -- no reply or READ on this QP ever asks for a completion
	return rdma_create_ep(&listen_id, res, NULL, &attr);
}

static int rpc_register_buffers(void)
{
	/* OK: rdma-local-mr-management, rdma-registration-in-datapath -- send buffer, registered once per connection and kept in a global */
	send_mr = rdma_reg_msgs(id, &send_msg, sizeof(send_msg));
	if (!send_mr)
		return -errno;
	// BUG: rdma-local-mr-management -- the request buffer is also the sink of the server's RPC_STAT RDMA READ
	recv_mr = rdma_reg_msgs(id, &recv_msg, sizeof(recv_msg));
	if (!recv_mr)
		goto out_send;

	staging = malloc(RPC_STAGING_SIZE);
	if (!staging)
		goto out_recv;
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE on the sink of the server's RDMA READ is what iWARP needs */
	staging_mr = rdma_reg_write(id, staging, RPC_STAGING_SIZE);	// BUG: rdma-local-mr-management -- sink of the server's own RDMA READ
	if (!staging_mr)
		goto out_free;

	/* OK: rdma-local-mr-management -- counters are only exposed in name; the key is never sent */
	stats_mr = rdma_reg_read(id, server_stats, sizeof(server_stats));	// BUG: rdma-remote-access-overbroad -- remote read on counters whose rkey no client is ever told
	if (!stats_mr)
		goto out_free;		// BUG: rdma-mr-leak, rdma-invalidation-leak -- out_free frees the staging buffer but never deregisters staging_mr, which grants remote write on it
	return 0;

out_free:
	free(staging);
out_recv:
	rdma_dereg_mr(recv_mr);
out_send:
	rdma_dereg_mr(send_mr);
	return -ENOMEM;
}

static int rpc_reply(uint32_t status, uint64_t addr, uint32_t rkey, uint32_t len)
{
	send_msg.op = RPC_GET;
	send_msg.status = status;
	send_msg.addr = addr;
	send_msg.rkey = rkey;
	send_msg.len = len;
	return rdma_post_send(id, NULL, &send_msg, sizeof(send_msg), send_mr, 0);
}

static int rpc_bind_chunk(struct ibv_mw *mw, uint32_t rkey, char *addr, uint32_t len)
{
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.opcode = IBV_WR_BIND_MW;	// BUG: rdma-local-mr-management -- window bound by hand over each staging chunk
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = staging_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;	// BUG: rdma-access-flags-invalid -- staging_mr comes from rdma_reg_write(), which never sets IBV_ACCESS_MW_BIND
	return ibv_post_send(id->qp, &wr, &bad);
}

/* RPC_STREAM: hand the staging buffer to the client one chunk at a time */
static int rpc_stream(uint32_t total)
{
	struct ibv_mw *mw;
	struct ibv_wc wc;
	uint32_t off, len, rkey;

	mw = ibv_alloc_mw(id->pd, IBV_MW_TYPE_2);	// BUG: rdma-local-mr-management -- window that exposes the staging chunks
	if (!mw)
		return -errno;
	rkey = ibv_inc_rkey(mw->rkey);	// BUG: rdma-rkey-reuse -- rotated once before the loop: every chunk is bound again under the key the client used for the previous one
	for (off = 0; off < total && off < RPC_STAGING_SIZE; off += len) {
		len = total - off < RPC_STREAM_CHUNK ? total - off : RPC_STREAM_CHUNK;
		if (rpc_bind_chunk(mw, rkey, staging + off, len))
			return -EIO;	// BUG: rdma-mr-leak -- the window allocated above is not deallocated on this return
		if (rpc_reply(0, (uintptr_t)(staging + off), rkey, len) ||
		    rdma_post_recv(id, NULL, &recv_msg, sizeof(recv_msg), recv_mr) ||
		    rdma_get_recv_comp(id, &wc) <= 0)
			break;
		if (wc.wc_flags & IBV_WC_WITH_INV)	// BUG: rdma-remote-invalidate-unchecked -- any invalidated rkey is taken as the end of this chunk's window
			continue;
		break;		/* old client: ibv_dealloc_mw() below invalidates the window */
	}
	ibv_dealloc_mw(mw);
	return 0;
}

static int rpc_serve(void)
{
	struct ibv_wc wc;
	struct ibv_mr *result_mr = NULL;
	char *result = NULL;
	size_t result_len;
	int ret;

	ret = rdma_post_recv(id, NULL, &recv_msg, sizeof(recv_msg), recv_mr);
	if (ret)
		return ret;

	for (;;) {
		ret = rdma_get_recv_comp(id, &wc);
		if (ret <= 0 || wc.status != IBV_WC_SUCCESS)
			break;

		switch (recv_msg.op) {
		case RPC_PUT:
			/* OK: rdma-access-flags-transport -- the staging sink has REMOTE_WRITE */
			ret = rdma_post_read(id, NULL, staging, recv_msg.len, staging_mr, 0, recv_msg.addr, recv_msg.rkey);
			break;
		case RPC_STAT:
			// BUG: rdma-access-flags-transport -- READ into the request buffer, registered by rdma_reg_msgs without REMOTE_WRITE
			ret = rdma_post_read(id, NULL, recv_msg.payload, sizeof(recv_msg.payload), recv_mr, 0, recv_msg.addr, recv_msg.rkey);
			break;
		case RPC_GET:
			if (rpc_build_result(&recv_msg, &result, &result_len)) {
				ret = rpc_reply(ENOMEM, 0, 0, 0);
				break;
			}
			// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a registration per GET, inside the serving loop, whose key goes to the client
			result_mr = rdma_reg_read(id, result, result_len);
			if (!result_mr) {
				free(result);
				result = NULL;
				ret = rpc_reply(errno, 0, 0, 0);
				break;
			}
			ret = rpc_reply(0, (uintptr_t)result, result_mr->rkey, result_len);
			break;
		case RPC_DONE:
			if (result_mr) {
				rdma_dereg_mr(result_mr);	// BUG: rdma-registration-in-datapath -- and a deregistration per GET
				/* OK: rdma-invalidation-leak -- deregistered before the result buffer is freed */
				free(result);
				result_mr = NULL;
				result = NULL;
			}
			ret = rpc_reply(0, 0, 0, 0);
			break;
		case RPC_STREAM:
			ret = rpc_stream(recv_msg.len);
			break;
		case RPC_QUIT:
		default:
			ret = -1;
			break;
		}
		if (ret || rdma_post_recv(id, NULL, &recv_msg, sizeof(recv_msg), recv_mr))
			break;
	}

	/* client went away while holding a GET result */
	if (result) {
		free(result);		// BUG: rdma-invalidation-leak -- the result is freed while its remote-read registration is still alive
		if (result_mr)
			rdma_dereg_mr(result_mr);
	}
	return ret;
}

int rpc_server_run(const char *port)
{
	struct rdma_addrinfo hints, *res;
	int ret;

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(NULL, port, &hints, &res);
	if (ret)
		return ret;
	ret = rpc_ep_setup(res, RPC_RECV_DEPTH, RPC_RECV_SGE);
	rdma_freeaddrinfo(res);
	if (ret)
		return ret;
	ret = rdma_listen(listen_id, 0);
	if (ret)
		goto out_listen;

	while ((ret = rdma_get_request(listen_id, &id)) == 0) {
		if (rpc_register_buffers())
			break;
		ret = rdma_accept(id, NULL);
		if (!ret)
			ret = rpc_serve();
		rdma_disconnect(id);
		rdma_dereg_mr(stats_mr);
		rdma_dereg_mr(staging_mr);
		free(staging);		/* OK: rdma-invalidation-leak -- staging_mr is deregistered first */
		rdma_dereg_mr(recv_mr);
		rdma_dereg_mr(send_mr);
		rdma_destroy_ep(id);
	}
out_listen:
	rdma_destroy_ep(listen_id);
	return ret;
}
