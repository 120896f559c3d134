/*
 * imring: a one-way message ring.  The server exposes a ring of fixed-size
 * slots (rdma_reg_write) and returns its address and rkey in the accept's
 * private data; the client RDMA-WRITEs each message into the next slot
 * with immediate data carrying the slot index, which consumes one receive
 * on the server and tells it which slot is full.  Credits come back as
 * small SENDs.
 *
 * Correct: all work requests are signaled (sq_sig_all = 1); the ring's key
 * really goes to the client; the client's source buffer is local-only.
 * Not correct: the server needs one posted receive per slot and asks for
 * 4096 receive WRs without checking max_qp_wr (several providers allow
 * fewer, and rxe/siw less still).
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RING_SLOTS	4096
#define SLOT_SIZE	512

struct ring_info {
	uint64_t addr;
	uint32_t rkey;
	uint32_t slots;
};

struct ring_server {
	struct rdma_cm_id *listen_id;
	struct rdma_cm_id *id;
	char              *ring;
	struct ibv_mr     *ring_mr;
};

struct ring_client {
	struct rdma_cm_id *id;
	char              *src;
	struct ibv_mr     *src_mr;
	struct ring_info   ri;
	uint32_t           next_slot;
};

int ring_server_start(struct ring_server *s, const char *port)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;
	struct ring_info ri;
	int i, ret;

	if (rdma_getaddrinfo(NULL, port, &hints, &res))
		return -errno;
	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = 64;
	attr.cap.max_recv_wr = RING_SLOTS; // BUG: rdma-queue-cap-unchecked -- 4096 receive WRs requested without comparing with max_qp_wr
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	ret = rdma_create_ep(&s->listen_id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	if (ret)
		return -errno;
	if (rdma_listen(s->listen_id, 1) || rdma_get_request(s->listen_id, &s->id))
		goto err_listen;

	s->ring = calloc(RING_SLOTS, SLOT_SIZE);
	if (!s->ring)
		goto err_id;
	/* OK: rdma-remote-access-overbroad -- address and rkey go to the client in the accept's private data */
	s->ring_mr = rdma_reg_write(s->id, s->ring, (size_t)RING_SLOTS * SLOT_SIZE); // BUG: rdma-local-mr-management -- rkey handed to the peer
	if (!s->ring_mr)
		goto err_ring;
	for (i = 0; i < RING_SLOTS; i++)
		if (rdma_post_recvv(s->id, NULL, NULL, 0))
			goto err_mr;

	ri.addr = htobe64((uintptr_t)s->ring);
	ri.rkey = htobe32(s->ring_mr->rkey);
	ri.slots = htobe32(RING_SLOTS);
	memset(&param, 0, sizeof(param));
	param.private_data = &ri;
	param.private_data_len = sizeof(ri);
	if (rdma_accept(s->id, &param))
		goto err_mr;
	return 0;

err_mr:
	rdma_dereg_mr(s->ring_mr);
err_ring:
	free(s->ring);
err_id:
	rdma_destroy_ep(s->id);
err_listen:
	rdma_destroy_ep(s->listen_id);
	return -EIO;
}

int ring_client_connect(struct ring_client *c, const char *host, const char *port)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct ibv_qp_init_attr attr;
	int ret;

	if (rdma_getaddrinfo(host, port, &hints, &res))
		return -errno;
	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = 128;
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;	/* OK: rdma-unsignaled-send-starvation -- every WR is signaled */
	ret = rdma_create_ep(&c->id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	if (ret)
		return -errno;

	c->src = malloc(SLOT_SIZE);
	if (!c->src)
		goto err_ep;
	c->src_mr = rdma_reg_msgs(c->id, c->src, SLOT_SIZE); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITE
	if (!c->src_mr)
		goto err_src;
	if (rdma_connect(c->id, NULL))
		goto err_mr;
	if (c->id->event && c->id->event->param.conn.private_data_len >= sizeof(c->ri))
		memcpy(&c->ri, c->id->event->param.conn.private_data, sizeof(c->ri));
	return 0;

err_mr:
	/* OK: rdma-mr-leak -- deregistered before the endpoint goes */
	rdma_dereg_mr(c->src_mr);
err_src:
	free(c->src);
err_ep:
	rdma_destroy_ep(c->id);
	return -EIO;
}

int ring_client_send(struct ring_client *c, const void *msg, uint32_t len)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	uint32_t slot = c->next_slot++ % be32toh(c->ri.slots);
	struct ibv_wc wc;

	if (len > SLOT_SIZE)
		return -EMSGSIZE;
	memcpy(c->src, msg, len);
	sge.addr = (uintptr_t)c->src;
	sge.length = len;
	sge.lkey = c->src_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htobe32(slot);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = be64toh(c->ri.addr) + (uint64_t)slot * SLOT_SIZE;
	wr.wr.rdma.rkey = be32toh(c->ri.rkey);
	if (ibv_post_send(c->id->qp, &wr, &bad))
		return -EIO;
	/* the source buffer is reused for the next message: wait */
	if (rdma_get_send_comp(c->id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	return 0;
}
