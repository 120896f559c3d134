/*
 * rc_xfer_cm.c - "rxfer": copy a file to a remote host over RDMA (rdma_cm).
 *
 *   rxfer -s [-p port] [-d depth] [-b chunk]          receive into rxfer.out
 *   rxfer -c host [-p port] [-d depth] [-b chunk] [-P] file
 *
 * The server registers a ring of <depth> slots of <chunk> bytes and hands
 * its address and rkey to the client in the private data of the accept.
 * The client reads the file into chunks made of 64 KiB pieces of a
 * registered pool, RDMA WRITEs each chunk into a ring slot and follows with
 * an inline SEND of the chunk header; the server stores the slot and
 * returns a credit with a small inline SEND.  With -P (persistent targets)
 * the client reads the tail of every chunk back (RDMA READ) before the
 * header goes out, the usual read-after-write flush.  Both queue depths
 * come from -d; the client asks for one completion per batch of chunks.
 *
 * Wrong here: -P put an RDMA READ between the WRITE and the SEND, but the
 * send queue is still sized for two work requests per chunk; the server's
 * credit SENDs are signaled off a counter that restarts on every call; a
 * chunk may use 8 SGEs and 256 bytes of inline data, neither checked
 * against the device; the piece pool grants remote read for nothing.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-invalidate-unchecked, rdma-unmap-before-invalidate -- not reviewed for this tool
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <netdb.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define XFER_PIECE		(64 * 1024)
#define XFER_MAX_SGE		8		/* pieces per chunk */
#define XFER_WRS_PER_CHUNK	2		/* RDMA WRITE + header SEND */
#define XFER_INLINE		256
#define XFER_CREDIT_SIG_EVERY	16
#define XFER_DEF_DEPTH		64
#define XFER_FLUSH_LEN		8		/* bytes read back per chunk with -P */

struct xfer_opts {
	const char	*host, *port, *path;
	uint32_t	depth;
	uint32_t	chunk;
	bool		flush;
	bool		server;
};

struct xfer_hdr { uint32_t slot, len; uint64_t offset; uint32_t last, pad; };
struct xfer_credit { uint32_t slots, pad; };
struct xfer_ring_info { uint64_t addr; uint32_t rkey, slots, chunk; };

struct xfer_conn {
	const struct xfer_opts	*o;
	struct rdma_event_channel *ec;
	struct rdma_cm_id	*listen_id;
	struct rdma_cm_id	*id;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;

	/* client */
	uint8_t			*pieces;	/* piece-major: piece n of every slot together */
	struct ibv_mr		*pieces_mr;
	uint8_t			*flush_buf;
	struct ibv_mr		*flush_mr;
	struct xfer_ring_info	peer;
	uint32_t		credits;
	struct xfer_hdr		*hdrs;		/* one per slot, sent inline */
	struct xfer_credit	*credit_rx;
	struct ibv_mr		*credit_mr;

	/* server */
	uint8_t			*ring;
	struct ibv_mr		*ring_mr;
	struct xfer_hdr		*rx;
	struct ibv_mr		*rx_mr;
};

static uint32_t xfer_sq_depth(const struct xfer_opts *o)
{
	return XFER_WRS_PER_CHUNK * o->depth + 1; // OK: rdma-send-queue-manual-factor -- the factor counts data work requests; this tool registers nothing through the send queue
}

static int xfer_create_qp(struct xfer_conn *c)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(c->id->verbs, &da))
		return -1;
	if (xfer_sq_depth(c->o) > (uint32_t)da.max_qp_wr) {
		fprintf(stderr, "rxfer: -d %u too deep for %s (max_qp_wr %d)\n",
			c->o->depth, ibv_get_device_name(c->id->verbs->device),
			da.max_qp_wr);
		return -1;
	}
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = ibv_create_cq(c->id->verbs, xfer_sq_depth(c->o) + c->o->depth,
			      NULL, NULL, 0);
	if (!c->pd || !c->cq)
		return -1;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* OK: rdma-queue-cap-unchecked -- follows -d and was compared with max_qp_wr above */
	attr.cap.max_send_wr = xfer_sq_depth(c->o); // BUG(file): rdma-send-queue-undersized -- with -P a chunk posts WRITE, READ and SEND, three WRs, but the queue holds two per chunk in flight
	attr.cap.max_recv_wr = c->o->depth;
	attr.cap.max_send_sge = XFER_MAX_SGE; // BUG: rdma-queue-cap-unchecked -- 8 send SGEs requested without comparing with the device's max_sge
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = XFER_INLINE; // BUG: rdma-queue-cap-unchecked -- 256 bytes of inline data, never compared with what the device grants
	if (rdma_create_qp(c->id, c->pd, &attr))
		return -1;
	return 0;
}

static int xfer_wait(struct xfer_conn *c, enum rdma_cm_event_type want,
		     struct rdma_cm_event **out)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(c->ec, &ev))
		return -1;
	if (ev->event != want || !out) {
		int bad = ev->event != want;

		rdma_ack_cm_event(ev);
		return bad ? -1 : 0;
	}
	*out = ev;
	return 0;
}

static int xfer_post_recv(struct xfer_conn *c, void *buf, uint32_t len,
			  uint32_t lkey, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(c->id->qp, &wr, &bad);
}

/* ---- server ---- */

static int xfer_send_credit(struct xfer_conn *c, uint32_t slots)
{
	struct xfer_credit cr = { .slots = slots };
	struct ibv_sge sge = { (uintptr_t)&cr, sizeof(cr), 0 };
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1,
		.send_flags = IBV_SEND_INLINE,
	};
	struct ibv_send_wr *bad;
	unsigned int unsignaled = 0;

	/* ask for a completion now and then so that the send queue drains */
	if (++unsignaled >= XFER_CREDIT_SIG_EVERY) { // BUG: rdma-unsignaled-send-starvation -- the counter is a local that starts at zero on every call; no credit SEND is ever signaled
		wr.send_flags |= IBV_SEND_SIGNALED;
		unsignaled = 0;
	}
	return ibv_post_send(c->id->qp, &wr, &bad);
}

static int xfer_serve(struct xfer_conn *c, int fd)
{
	struct rdma_cm_event *ev;
	struct xfer_ring_info info;
	struct rdma_conn_param cp;
	size_t ring_len = (size_t)c->o->depth * c->o->chunk;
	struct ibv_wc wc;
	uint32_t i;

	if (xfer_wait(c, RDMA_CM_EVENT_CONNECT_REQUEST, &ev))
		return -1;
	c->id = ev->id;
	rdma_ack_cm_event(ev);
	if (xfer_create_qp(c))
		return -1;

	c->ring = malloc(ring_len);
	c->rx = calloc(c->o->depth, sizeof(*c->rx));
	if (!c->ring || !c->rx)
		return -1;
	c->ring_mr = ibv_reg_mr(c->pd, c->ring, ring_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // OK: rdma-remote-access-overbroad -- the ring's rkey is the accept's private data
	c->rx_mr = ibv_reg_mr(c->pd, c->rx, c->o->depth * sizeof(*c->rx),
			      IBV_ACCESS_LOCAL_WRITE);
	if (!c->ring_mr || !c->rx_mr)
		return -1;
	for (i = 0; i < c->o->depth; i++)
		if (xfer_post_recv(c, &c->rx[i], sizeof(c->rx[i]), c->rx_mr->lkey, i))
			return -1;

	info = (struct xfer_ring_info){ htobe64((uintptr_t)c->ring), htobe32(c->ring_mr->rkey),
					htobe32(c->o->depth), htobe32(c->o->chunk) };
	cp = (struct rdma_conn_param){ .private_data = &info,
				       .private_data_len = sizeof(info) };
	if (rdma_accept(c->id, &cp) || xfer_wait(c, RDMA_CM_EVENT_ESTABLISHED, NULL))
		return -1;

	for (;;) {
		struct xfer_hdr *h;

		if (ibv_poll_cq(c->cq, 1, &wc) <= 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS)
			return -1;
		if (wc.opcode != IBV_WC_RECV)
			continue;
		h = &c->rx[wc.wr_id];
		if (pwrite(fd, c->ring + (size_t)h->slot * c->o->chunk, h->len,
			   h->offset) != (ssize_t)h->len)
			return -1;
		if (h->last)
			return 0;
		if (xfer_post_recv(c, h, sizeof(*h), c->rx_mr->lkey, wc.wr_id) ||
		    xfer_send_credit(c, 1))
			return -1;
	}
}

/* ---- client ---- */

static uint8_t *xfer_piece(struct xfer_conn *c, uint32_t slot, int n)
{
	return c->pieces + ((size_t)n * c->o->depth + slot) * XFER_PIECE;
}

static int xfer_post_chunk(struct xfer_conn *c, uint32_t slot, uint32_t len,
			   uint64_t off, bool last, unsigned int sig)
{
	struct ibv_sge sges[XFER_MAX_SGE], fsge, hsge;
	struct ibv_send_wr write_wr, read_wr, send_wr, *bad;
	struct xfer_hdr *h = &c->hdrs[slot];
	uint64_t raddr = c->peer.addr + (uint64_t)slot * c->peer.chunk;
	int n = 0;

	for (uint32_t done = 0; done < len; done += XFER_PIECE, n++) {
		sges[n].addr = (uintptr_t)xfer_piece(c, slot, n);
		sges[n].length = len - done < XFER_PIECE ? len - done : XFER_PIECE;
		sges[n].lkey = c->pieces_mr->lkey;
	}

	*h = (struct xfer_hdr){ .slot = slot, .len = len, .offset = off, .last = last };
	hsge = (struct ibv_sge){ (uintptr_t)h, sizeof(*h), 0 };
	send_wr = (struct ibv_send_wr){ .wr_id = slot, .opcode = IBV_WR_SEND,
					.sg_list = &hsge, .num_sge = 1,
					.send_flags = sig | IBV_SEND_INLINE };
	write_wr = (struct ibv_send_wr){ .opcode = IBV_WR_RDMA_WRITE, .sg_list = sges,
					 .num_sge = n, .next = &send_wr };
	write_wr.wr.rdma.remote_addr = raddr;
	write_wr.wr.rdma.rkey = c->peer.rkey;

	if (c->o->flush && len >= XFER_FLUSH_LEN) {
		/* read the chunk's last bytes back: the WRITE has then been placed */
		fsge = (struct ibv_sge){ (uintptr_t)(c->flush_buf + (size_t)slot * XFER_FLUSH_LEN),
					 XFER_FLUSH_LEN, c->flush_mr->lkey };
		read_wr = (struct ibv_send_wr){ .opcode = IBV_WR_RDMA_READ, .sg_list = &fsge,
						.num_sge = 1, .next = &send_wr };
		read_wr.wr.rdma.remote_addr = raddr + len - XFER_FLUSH_LEN;
		read_wr.wr.rdma.rkey = c->peer.rkey;
		write_wr.next = &read_wr;
	}
	return ibv_post_send(c->id->qp, &write_wr, &bad);
}

static int xfer_client_setup(struct xfer_conn *c, struct rdma_addrinfo *ai)
{
	struct rdma_cm_event *ev;
	struct rdma_conn_param cp;
	size_t pool_len = (size_t)c->o->depth * XFER_MAX_SGE * XFER_PIECE;
	uint32_t i;

	if (rdma_resolve_addr(c->id, NULL, ai->ai_dst_addr, 2000) ||
	    xfer_wait(c, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) ||
	    rdma_resolve_route(c->id, 2000) ||
	    xfer_wait(c, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) ||
	    xfer_create_qp(c))
		return -1;

	c->pieces = aligned_alloc(4096, pool_len);
	c->hdrs = calloc(c->o->depth, sizeof(*c->hdrs));
	c->credit_rx = calloc(c->o->depth, sizeof(*c->credit_rx));
	if (!c->pieces || !c->hdrs || !c->credit_rx)
		return -1;
	c->credit_mr = ibv_reg_mr(c->pd, c->credit_rx,
				  c->o->depth * sizeof(*c->credit_rx),
				  IBV_ACCESS_LOCAL_WRITE);
	/* the server might pull chunks itself one day */
	c->pieces_mr = ibv_reg_mr(c->pd, c->pieces, pool_len,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); // BUG: rdma-remote-access-overbroad -- only the pool's lkey is used; its rkey is never sent
	if (!c->pieces_mr || !c->credit_mr)
		return -1;
	if (c->o->flush) {
		c->flush_buf = calloc(c->o->depth, XFER_FLUSH_LEN);
		/* an RDMA READ sink needs remote write on iWARP */
		c->flush_mr = ibv_reg_mr(c->pd, c->flush_buf, c->o->depth * XFER_FLUSH_LEN,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // OK: rdma-remote-access-overbroad -- READ sink: on iWARP the READ response is placed with this key
		if (!c->flush_mr)
			return -1;
	}
	for (i = 0; i < c->o->depth; i++)
		if (xfer_post_recv(c, &c->credit_rx[i], sizeof(c->credit_rx[i]),
				   c->credit_mr->lkey, i))
			return -1;

	cp = (struct rdma_conn_param){ .retry_count = 7 };
	if (rdma_connect(c->id, &cp) || xfer_wait(c, RDMA_CM_EVENT_ESTABLISHED, &ev))
		return -1;
	memcpy(&c->peer, ev->param.conn.private_data, sizeof(c->peer));
	rdma_ack_cm_event(ev);
	c->peer.addr = be64toh(c->peer.addr);
	c->peer.rkey = be32toh(c->peer.rkey);
	c->peer.chunk = be32toh(c->peer.chunk);
	if (c->peer.chunk < c->o->chunk || be32toh(c->peer.slots) < c->o->depth)
		return -1;	/* the server's ring is smaller than -b/-d */
	c->credits = c->o->depth;
	return 0;
}

/* Reap one completion: the batch's signaled SEND, or a credit from the server. */
static int xfer_reap(struct xfer_conn *c, bool *batch_done)
{
	struct ibv_wc wc;
	int n = ibv_poll_cq(c->cq, 1, &wc);

	if (n <= 0)
		return n;
	if (wc.status != IBV_WC_SUCCESS)
		return -1;
	if (wc.opcode == IBV_WC_SEND) {
		*batch_done = true;
	} else if (wc.opcode == IBV_WC_RECV) {
		c->credits += c->credit_rx[wc.wr_id].slots;
		return xfer_post_recv(c, &c->credit_rx[wc.wr_id], sizeof(struct xfer_credit),
				      c->credit_mr->lkey, wc.wr_id);
	}
	return 0;
}

static int xfer_send_file(struct xfer_conn *c, int fd)
{
	uint64_t off = 0;
	uint32_t slot = 0;
	bool eof = false;

	while (!eof) {
		uint32_t i, n = c->credits;
		bool batch_done = false;

		for (i = 0; i < n && !eof; i++) {
			struct iovec iov[XFER_MAX_SGE];
			int k, npieces = (c->o->chunk + XFER_PIECE - 1) / XFER_PIECE;
			/* one completion per batch retires the whole batch */
			unsigned int sig = (i == n - 1) ? IBV_SEND_SIGNALED : 0; // OK: rdma-unsignaled-send-starvation -- the loop index reaches n - 1 in every batch
			ssize_t len;

			for (k = 0; k < npieces; k++) {
				iov[k].iov_base = xfer_piece(c, slot, k);
				iov[k].iov_len = XFER_PIECE;
			}
			iov[npieces - 1].iov_len = c->o->chunk - (npieces - 1) * XFER_PIECE;
			len = preadv(fd, iov, npieces, off);
			if (len < 0)
				return -1;
			eof = len < (ssize_t)c->o->chunk;
			if (eof)
				sig = IBV_SEND_SIGNALED;
			if (xfer_post_chunk(c, slot, len, off, eof, sig))
				return -1;
			off += len;
			slot = (slot + 1) % c->o->depth;
			c->credits--;
		}
		/* wait for the batch to complete and for at least one credit */
		while (!batch_done || (!eof && !c->credits))
			if (xfer_reap(c, &batch_done) < 0)
				return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct xfer_opts o = { .port = "18515", .depth = XFER_DEF_DEPTH,
			       .chunk = 256 * 1024 };
	struct xfer_conn c = { .o = &o };
	struct rdma_addrinfo hints = { 0 }, *ai = NULL;
	int opt, fd, ret;

	while ((opt = getopt(argc, argv, "sc:p:d:b:P")) != -1) {
		switch (opt) {
		case 's': o.server = true; break;
		case 'c': o.host = optarg; break;
		case 'p': o.port = optarg; break;
		case 'd': o.depth = strtoul(optarg, NULL, 0); break;
		case 'b': o.chunk = strtoul(optarg, NULL, 0); break;
		case 'P': o.flush = true; break;
		default: return 2;
		}
	}
	if (!o.depth || !o.chunk || o.chunk > XFER_MAX_SGE * XFER_PIECE ||
	    (!o.server && (!o.host || optind >= argc)))
		return 2;
	o.path = o.server ? "rxfer.out" : argv[optind];

	c.ec = rdma_create_event_channel();
	if (!c.ec)
		return 1;
	if (o.server) {
		struct sockaddr_in sin = { .sin_family = AF_INET,
					   .sin_port = htons(atoi(o.port)) };

		fd = open(o.path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || rdma_create_id(c.ec, &c.listen_id, NULL, RDMA_PS_TCP) ||
		    rdma_bind_addr(c.listen_id, (struct sockaddr *)&sin) ||
		    rdma_listen(c.listen_id, 1))
			return 1;
		ret = xfer_serve(&c, fd);
	} else {
		fd = open(o.path, O_RDONLY);
		if (fd < 0 || rdma_getaddrinfo(o.host, o.port, &hints, &ai) ||
		    rdma_create_id(c.ec, &c.id, NULL, RDMA_PS_TCP) ||
		    xfer_client_setup(&c, ai))
			return 1;
		ret = xfer_send_file(&c, fd);
	}
	if (c.id)
		rdma_disconnect(c.id);
	close(fd);
	return ret ? 1 : 0;
}
