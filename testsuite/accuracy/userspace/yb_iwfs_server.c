/*
 * yb_iwfs_server.c - small file server over rdma_cm that runs on
 * InfiniBand, RoCE and iWARP adapters.
 *
 * Protocol: the client SENDs an fs_msg naming a file range and its own
 * buffer (addr, rkey).
 *   FS_OP_WRITE    the server pulls the data with RDMA READ into a staging
 *                  slot (or, above FS_SLOT_SIZE, straight into a mapping of
 *                  the file) and writes it out;
 *   FS_OP_READ     the server pushes file data with RDMA WRITE;
 *   FS_OP_SETATTR  the server pulls the client's attribute blob;
 *   FS_OP_READDIR  the server pushes directory entries from a buffer that
 *                  grows with the largest directory seen.
 * Small writes may also be pushed by the client into the connection's
 * inbox, a memory window bound once the connection is established; its
 * address and rkey go to the client in an inline hello message.
 *
 * READ sinks need remote write on iWARP.  The staging pool and the file
 * mappings get it from inline transport tests; the attribute buffer,
 * registered with rdma_reg_msgs(), does not get it at all.  Other known
 * problems: the reply ring carries remote read that no client can use,
 * the inbox MR lacks local write for a remote-write window, one unwinding
 * label in the buffer set-up skips the pool, and large writes register
 * the file mapping for every request.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-queue-cap-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked -- annotated for MR lifetime, registration placement and access rights only
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define FS_QUEUE_DEPTH	32
#define FS_SLOT_SIZE	(64 * 1024)
#define FS_NSLOTS	FS_QUEUE_DEPTH
#define FS_ATTR_MAX	512
#define FS_INBOX_SIZE	(1024 * 1024)
#define FS_MAX_FILES	256

enum fs_op { FS_OP_WRITE = 1, FS_OP_READ, FS_OP_SETATTR, FS_OP_READDIR };

struct fs_msg {
	uint32_t op;
	uint32_t file_id;
	uint64_t offset;
	uint64_t len;
	uint64_t addr;
	uint32_t rkey;
	uint32_t tag;
};

struct fs_reply {
	uint32_t tag;
	int32_t	 status;
	uint64_t len;
};

struct fs_accept_data {
	uint64_t inbox_addr;
	uint32_t inbox_rkey;
	uint32_t inbox_len;
};

struct fs_conn;

struct fs_req {
	struct fs_conn	*conn;
	struct fs_msg	msg;
	int		slot;
	void		*map;
	size_t		map_len;
	struct ibv_mr	*map_mr;
};

struct fs_conn {
	struct rdma_cm_id	*id;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	enum ibv_transport_type	transport;
	uint32_t		max_read_sge;

	struct fs_msg		*recv_msgs;
	struct ibv_mr		*recv_mr;
	struct fs_reply		*replies;
	struct ibv_mr		*reply_mr;
	char			*pool;
	struct ibv_mr		*pool_mr;
	char			*attr_buf;
	struct ibv_mr		*attr_mr;
	char			*inbox;
	struct ibv_mr		*inbox_mr;
	struct ibv_mw		*inbox_mw;
	char			*dirent_buf;
	size_t			dirent_len;
	struct ibv_mr		*dirent_mr;

	uint64_t		slot_busy;
	struct fs_req		reqs[FS_QUEUE_DEPTH];
};

static int g_files[FS_MAX_FILES];

static int fs_conn_query_caps(struct fs_conn *c)
{
	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;

	if (ibv_query_device(c->id->verbs, &dattr) ||
	    ibv_query_port(c->id->verbs, c->id->port_num, &pattr))
		return -1;
	c->transport = c->id->verbs->device->transport_type;
	c->max_read_sge = dattr.max_sge_rd ? dattr.max_sge_rd : 1;
	if (c->transport == IBV_TRANSPORT_IWARP) // OK: rdma-access-flags-transport -- decides READ scatter sizing, not access rights
		c->max_read_sge = 1;
	if (pattr.state != IBV_PORT_ACTIVE)
		fprintf(stderr, "iwfs: port %u not active\n", c->id->port_num);
	return 0;
}

static int fs_conn_setup_buffers(struct fs_conn *c)
{
	int access;

	c->recv_msgs = calloc(FS_QUEUE_DEPTH, sizeof(*c->recv_msgs));
	c->replies = calloc(FS_QUEUE_DEPTH, sizeof(*c->replies));
	c->pool = aligned_alloc(4096, (size_t)FS_NSLOTS * FS_SLOT_SIZE);
	c->attr_buf = malloc(FS_ATTR_MAX * FS_QUEUE_DEPTH);
	c->inbox = aligned_alloc(4096, FS_INBOX_SIZE);
	if (!c->recv_msgs || !c->replies || !c->pool || !c->attr_buf || !c->inbox)
		goto err_recv;

	c->recv_mr = ibv_reg_mr(c->pd, c->recv_msgs,
				FS_QUEUE_DEPTH * sizeof(*c->recv_msgs),
				IBV_ACCESS_LOCAL_WRITE);
	if (!c->recv_mr)
		goto err_recv;

	// BUG: rdma-remote-access-overbroad -- replies are SEND sources; their rkey never goes to a client
	c->reply_mr = ibv_reg_mr(c->pd, c->replies,
				 FS_QUEUE_DEPTH * sizeof(*c->replies),
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!c->reply_mr)
		goto err_reply;

	access = IBV_ACCESS_LOCAL_WRITE;
	if (c->transport == IBV_TRANSPORT_IWARP) // BUG: rdma-access-flags-transport -- the pool's rights are picked by an inline iWARP test
		access |= IBV_ACCESS_REMOTE_WRITE;
	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is always there; remote write only on iWARP, where the slots are READ sinks
	c->pool_mr = ibv_reg_mr(c->pd, c->pool, (size_t)FS_NSLOTS * FS_SLOT_SIZE, access);
	if (!c->pool_mr)
		goto err_pool;

	c->attr_mr = rdma_reg_msgs(c->id, c->attr_buf, FS_ATTR_MAX * FS_QUEUE_DEPTH);
	if (!c->attr_mr)
		goto err_pool; // BUG: rdma-mr-leak -- jumps past the release of pool_mr

	/* the server never touches the inbox itself, clients write into it */
	c->inbox_mr = ibv_reg_mr(c->pd, c->inbox, FS_INBOX_SIZE, IBV_ACCESS_MW_BIND);
	if (!c->inbox_mr)
		goto err_attr;
	return 0;

err_attr:
	rdma_dereg_mr(c->attr_mr);
	ibv_dereg_mr(c->pool_mr);
err_pool:
	ibv_dereg_mr(c->reply_mr);
err_reply:
	ibv_dereg_mr(c->recv_mr);
err_recv:
	free(c->inbox);
	free(c->attr_buf);
	free(c->pool);
	free(c->replies);
	free(c->recv_msgs);
	return -ENOMEM;
}

static void fs_conn_destroy(struct fs_conn *c)
{
	if (c->inbox_mw)
		ibv_dealloc_mw(c->inbox_mw);
	if (c->qp)
		rdma_destroy_qp(c->id);
	if (c->dirent_mr)
		ibv_dereg_mr(c->dirent_mr);
	ibv_dereg_mr(c->inbox_mr);
	rdma_dereg_mr(c->attr_mr);
	ibv_dereg_mr(c->pool_mr);
	ibv_dereg_mr(c->reply_mr);
	ibv_dereg_mr(c->recv_mr);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	free(c->dirent_buf);
	free(c->inbox);
	free(c->attr_buf);
	free(c->pool);
	free(c->replies);
	free(c->recv_msgs);
	free(c);
}

/* once the connection is up: open the inbox and tell the client where it is */
static int fs_conn_bind_inbox(struct fs_conn *c, struct fs_accept_data *ad)
{
	struct ibv_mw_bind bind = {
		.wr_id = 0,
		.send_flags = 0,
		.bind_info = {
			.mr = c->inbox_mr,
			.addr = (uintptr_t)c->inbox,
			.length = FS_INBOX_SIZE,
			.mw_access_flags = IBV_ACCESS_REMOTE_WRITE, // BUG: rdma-access-flags-invalid -- a remote-write window over an MR registered without LOCAL_WRITE
		},
	};

	if (ibv_bind_mw(c->qp, c->inbox_mw, &bind))
		return -1;
	ad->inbox_addr = (uintptr_t)c->inbox;
	ad->inbox_rkey = c->inbox_mw->rkey;
	ad->inbox_len = FS_INBOX_SIZE;
	/* tiny and inline: the hello needs no registered buffer */
	return rdma_post_send(c->id, NULL, ad, sizeof(*ad), NULL, IBV_SEND_INLINE);
}

static int fs_post_recv(struct fs_conn *c, int i)
{
	return rdma_post_recv(c->id, &c->reqs[i], &c->recv_msgs[i],
			      sizeof(struct fs_msg), c->recv_mr);
}

static struct fs_conn *fs_conn_create(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qattr;
	struct rdma_conn_param param;
	struct fs_conn *c;
	int i;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->id = id;
	c->pd = id->pd;
	if (fs_conn_query_caps(c) || fs_conn_setup_buffers(c)) {
		free(c);
		return NULL;
	}

	c->cq = ibv_create_cq(id->verbs, FS_QUEUE_DEPTH * 4, c, NULL, 0);
	if (!c->cq)
		goto err;
	memset(&qattr, 0, sizeof(qattr));
	qattr.send_cq = c->cq;
	qattr.recv_cq = c->cq;
	qattr.qp_type = IBV_QPT_RC;
	qattr.cap.max_send_wr = FS_QUEUE_DEPTH * 3;
	qattr.cap.max_recv_wr = FS_QUEUE_DEPTH;
	qattr.cap.max_send_sge = 1;
	qattr.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, c->pd, &qattr))
		goto err;
	c->qp = id->qp;

	c->inbox_mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_1);
	if (!c->inbox_mw)
		goto err;
	for (i = 0; i < FS_QUEUE_DEPTH; i++) {
		c->reqs[i].conn = c;
		c->reqs[i].slot = -1;
		if (fs_post_recv(c, i))
			goto err;
	}

	memset(&param, 0, sizeof(param));
	param.responder_resources = 4;
	param.initiator_depth = 4;
	if (rdma_accept(id, &param))
		goto err;
	id->context = c;
	return c;

err:
	fs_conn_destroy(c); // OK: rdma-mr-leak -- every buffer MR and the window are released by fs_conn_destroy
	return NULL;
}

static int fs_reply(struct fs_conn *c, struct fs_req *r, int status, uint64_t len)
{
	struct fs_reply *rep = &c->replies[r - c->reqs];

	rep->tag = r->msg.tag;
	rep->status = status;
	rep->len = len;
	return rdma_post_send(c->id, r, rep, sizeof(*rep), c->reply_mr, IBV_SEND_SIGNALED);
}

static int fs_get_slot(struct fs_conn *c)
{
	int i;

	for (i = 0; i < FS_NSLOTS; i++) {
		if (!(c->slot_busy & (1ULL << i))) {
			c->slot_busy |= 1ULL << i;
			return i;
		}
	}
	return -1;
}

static void *fs_map_range(int fd, uint64_t off, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);

	return p == MAP_FAILED ? NULL : p;
}

static void fs_req_release(struct fs_req *r)
{
	struct fs_conn *c = r->conn;

	if (r->map_mr) {
		ibv_dereg_mr(r->map_mr); // BUG: rdma-registration-in-datapath -- the per-request mapping MR is torn down on the completion path
		r->map_mr = NULL;
	}
	if (r->map) {
		munmap(r->map, r->map_len);
		r->map = NULL;
	}
	if (r->slot >= 0) {
		c->slot_busy &= ~(1ULL << r->slot);
		r->slot = -1;
	}
}

static int fs_handle_large_write(struct fs_conn *c, struct fs_req *r)
{
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_sge sge;
	bool iwarp;

	r->map_len = r->msg.len;
	r->map = fs_map_range(g_files[r->msg.file_id], r->msg.offset, r->map_len);
	if (!r->map)
		return -errno;

	iwarp = c->id->verbs->device->node_type == IBV_NODE_RNIC; // BUG: rdma-access-flags-transport -- local boolean from a transport test picks the mapping's rights
	// BUG: rdma-registration-in-datapath -- the file mapping is registered for every large write
	r->map_mr = ibv_reg_mr(c->pd, r->map, r->map_len, // OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is present; remote write only as an iWARP READ sink
			       IBV_ACCESS_LOCAL_WRITE | (iwarp ? IBV_ACCESS_REMOTE_WRITE : 0));
	if (!r->map_mr) {
		fs_req_release(r);
		return -ENOMEM;
	}

	sge.addr = (uintptr_t)r->map;
	sge.length = (uint32_t)r->map_len;
	sge.lkey = r->map_mr->lkey;
	wr.wr_id = (uintptr_t)r;
	wr.opcode = IBV_WR_RDMA_READ; // OK: rdma-access-flags-transport -- the mapping has remote write whenever the device is iWARP
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = r->msg.addr;
	wr.wr.rdma.rkey = r->msg.rkey;
	if (ibv_post_send(c->qp, &wr, &bad)) {
		fs_req_release(r);
		return -EIO; // OK: rdma-mr-leak -- fs_req_release() deregistered the mapping
	}
	return 0;
}

static int fs_handle_write(struct fs_conn *c, struct fs_req *r)
{
	if (r->msg.len > FS_SLOT_SIZE)
		return fs_handle_large_write(c, r);

	r->slot = fs_get_slot(c);
	if (r->slot < 0)
		return -EBUSY;
	// OK: rdma-access-flags-transport -- the staging pool gets remote write on iWARP
	return rdma_post_read(c->id, r, c->pool + (size_t)r->slot * FS_SLOT_SIZE,
			      r->msg.len, c->pool_mr, IBV_SEND_SIGNALED,
			      r->msg.addr, r->msg.rkey);
}

static int fs_handle_read(struct fs_conn *c, struct fs_req *r)
{
	char *dst;
	ssize_t n;

	r->slot = fs_get_slot(c);
	if (r->slot < 0)
		return -EBUSY;
	dst = c->pool + (size_t)r->slot * FS_SLOT_SIZE;
	n = pread(g_files[r->msg.file_id], dst,
		  r->msg.len < FS_SLOT_SIZE ? r->msg.len : FS_SLOT_SIZE, (off_t)r->msg.offset);
	if (n < 0)
		return fs_reply(c, r, -errno, 0);
	return rdma_post_write(c->id, r, dst, (size_t)n, c->pool_mr, 0,
			       r->msg.addr, r->msg.rkey) ?: fs_reply(c, r, 0, (uint64_t)n);
}

static int fs_handle_setattr(struct fs_conn *c, struct fs_req *r)
{
	char *blob = c->attr_buf + (r - c->reqs) * FS_ATTR_MAX;

	if (r->msg.len > FS_ATTR_MAX)
		return fs_reply(c, r, -EINVAL, 0);
	// BUG: rdma-access-flags-transport -- READ into attr_buf, registered by rdma_reg_msgs() without remote write
	return rdma_post_read(c->id, r, blob, r->msg.len, c->attr_mr,
			      IBV_SEND_SIGNALED, r->msg.addr, r->msg.rkey);
}

/* grows with the largest directory listed on this connection */
static int fs_ensure_dirent_buf(struct fs_conn *c, size_t want)
{
	char *buf;

	if (want <= c->dirent_len)
		return 0;
	if (c->dirent_mr) {
		ibv_dereg_mr(c->dirent_mr);
		c->dirent_mr = NULL;
		c->dirent_len = 0;
	}
	buf = realloc(c->dirent_buf, want);
	if (!buf)
		return -ENOMEM;
	c->dirent_buf = buf;
	// OK: rdma-registration-in-datapath, rdma-mr-leak -- grows only past the recorded size, and the old MR was released above
	c->dirent_mr = ibv_reg_mr(c->pd, buf, want, 0);
	if (!c->dirent_mr)
		return -ENOMEM;
	c->dirent_len = want;
	return 0;
}

static int fs_handle_readdir(struct fs_conn *c, struct fs_req *r)
{
	size_t want = r->msg.len;
	int rc;

	rc = fs_ensure_dirent_buf(c, want);
	if (rc)
		return fs_reply(c, r, rc, 0);
	memset(c->dirent_buf, 0, want);
	snprintf(c->dirent_buf, want, "file-%u", r->msg.file_id);
	return rdma_post_write(c->id, r, c->dirent_buf, want, c->dirent_mr, 0,
			       r->msg.addr, r->msg.rkey) ?: fs_reply(c, r, 0, want);
}

static void fs_handle_wc(struct fs_conn *c, struct ibv_wc *wc)
{
	struct fs_req *r = (struct fs_req *)(uintptr_t)wc->wr_id;
	int rc = 0, i;

	if (!r)
		return;		/* the inline hello */
	i = (int)(r - c->reqs);
	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "iwfs: %s\n", ibv_wc_status_str(wc->status));
		fs_req_release(r);
		return;
	}
	switch (wc->opcode) {
	case IBV_WC_RECV:
		r->msg = c->recv_msgs[i];
		if (r->msg.file_id >= FS_MAX_FILES)
			rc = -EINVAL;
		else if (r->msg.op == FS_OP_WRITE)
			rc = fs_handle_write(c, r);
		else if (r->msg.op == FS_OP_READ)
			rc = fs_handle_read(c, r);
		else if (r->msg.op == FS_OP_SETATTR)
			rc = fs_handle_setattr(c, r);
		else if (r->msg.op == FS_OP_READDIR)
			rc = fs_handle_readdir(c, r);
		if (rc)
			fs_reply(c, r, rc, 0);
		break;
	case IBV_WC_RDMA_READ:
		if (r->map)
			rc = msync(r->map, r->map_len, MS_SYNC);
		else if (r->slot >= 0)
			rc = pwrite(g_files[r->msg.file_id],
				    c->pool + (size_t)r->slot * FS_SLOT_SIZE,
				    r->msg.len, (off_t)r->msg.offset) < 0 ? -errno : 0;
		fs_reply(c, r, rc, r->msg.len);
		break;
	case IBV_WC_SEND:
		fs_req_release(r);
		fs_post_recv(c, i);
		break;
	default:
		break;
	}
}

int fs_conn_poll(struct fs_conn *c)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (i = 0; i < n; i++)
		fs_handle_wc(c, &wc[i]);
	return n;
}

int fs_handle_cm_event(struct rdma_cm_event *ev)
{
	struct rdma_cm_id *id = ev->id;
	enum rdma_cm_event_type type = ev->event;
	struct fs_accept_data ad;
	struct fs_conn *c;

	rdma_ack_cm_event(ev);
	switch (type) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		c = fs_conn_create(id);
		if (!c) {
			rdma_reject(id, NULL, 0);
			rdma_destroy_id(id);
		}
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		c = id->context;
		if (fs_conn_bind_inbox(c, &ad))
			rdma_disconnect(id);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		c = id->context;
		if (c)
			fs_conn_destroy(c); // OK: rdma-mr-leak -- teardown releases the connection's MRs in the same destroy function
		rdma_destroy_id(id);
		break;
	default:
		break;
	}
	return 0;
}
