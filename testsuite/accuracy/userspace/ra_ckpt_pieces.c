/*
 * ra_ckpt_pieces.c -- checkpoint service: exposes a process's memory to a
 * restore node that pulls it with RDMA READ.
 *
 * The application hands the service a list of segments.  Each segment is
 * registered in pieces of at most CKPT_PIECE_MAX bytes with REMOTE_READ
 * (large anonymous mappings cannot always be pinned in one go); segments
 * that cannot be registered in place (device or file mappings) are copied
 * into a staging buffer that is registered instead.  Every piece's
 * {addr, len, rkey} goes to the restore node over the TCP control socket,
 * the node acknowledges each segment, pulls everything, and says DONE.
 *
 * Right: segment and context unwinding, deregistration before the pieces'
 * memory goes away, the local-only control buffer.
 * Wrong: a segment whose descriptor table overflows leaks the piece it has
 * just registered; a staged segment that the restore node NACKs frees the
 * staging buffer while its registration (and the key the node already has)
 * stays; finishing a restore frees staging buffers before their
 * registrations are torn down.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-local-mr-management,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked
 *   -- not reviewed in this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define SUCCESS			(0)
#define FAILURE			(1)
#define CKPT_PIECE_MAX		(1UL << 30)
#define CKPT_MAX_PIECES		64
#define CKPT_MAX_SEGS		128
#define CKPT_MAX_DESCS		1024
#define CKPT_CTRL_SIZE		4096

#define SEG_F_STAGE		0x1	/* copy into a staging buffer */

struct ckpt_desc {
	uint64_t	addr;
	uint64_t	len;
	uint32_t	rkey;
	uint32_t	seg;
};

struct ckpt_segment {
	void		*addr;
	size_t		len;
	int		flags;
	void		*staging;
	int		npieces;
	struct ibv_mr	*mrs[CKPT_MAX_PIECES];
};

struct ckpt_context {
	struct ibv_context	*context;
	struct ibv_pd		*pd;
	int			sockfd;
	int			nsegs;
	struct ckpt_segment	segs[CKPT_MAX_SEGS];
	int			ndescs;
	struct ckpt_desc	descs[CKPT_MAX_DESCS];
	void			*ctrl_buf;	/* checksums, local use only */
	struct ibv_mr		*ctrl_mr;
};

static void *my_malloc(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, sysconf(_SC_PAGESIZE), len))
		return NULL;
	return p;
}

static void my_free(void *p)
{
	free(p);
}

static int ckpt_sock_send(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n <= 0)
			return FAILURE;
		p += n;
		len -= n;
	}
	return SUCCESS;
}

static int ckpt_sock_ack(int fd)
{
	char ack;

	if (read(fd, &ack, 1) != 1 || ack != 'A')
		return FAILURE;
	return SUCCESS;
}

static int ckpt_reg_piece(struct ckpt_context *ctx, void *addr, size_t len,
			  struct ibv_mr **out)
{
	*out = ibv_reg_mr(ctx->pd, addr, len, IBV_ACCESS_REMOTE_READ);
	if (!*out) {
		fprintf(stderr, " Couldn't register piece %p+%zu: %s\n", addr, len,
			strerror(errno));
		return FAILURE;
	}
	return SUCCESS;
}

static int ckpt_desc_append(struct ckpt_context *ctx, struct ibv_mr *mr, int seg)
{
	struct ckpt_desc *d;

	if (ctx->ndescs == CKPT_MAX_DESCS)
		return FAILURE;
	d = &ctx->descs[ctx->ndescs++];
	d->addr = (uintptr_t)mr->addr;
	d->len = mr->length;
	d->rkey = mr->rkey;
	d->seg = seg;
	return SUCCESS;
}

static int ckpt_register_segment(struct ckpt_context *ctx, int s)
{
	struct ckpt_segment *seg = &ctx->segs[s];
	size_t off = 0, len;
	int i, j, first_desc = ctx->ndescs;

	for (i = 0; off < seg->len; i++, off += len) {
		len = seg->len - off;
		if (len > CKPT_PIECE_MAX)
			len = CKPT_PIECE_MAX;
		if (i == CKPT_MAX_PIECES)
			goto unwind;
		if (ckpt_reg_piece(ctx, (char *)seg->addr + off, len, &seg->mrs[i]))
			goto unwind;
		if (ckpt_desc_append(ctx, seg->mrs[i], s))
			goto unwind;
	}
	seg->npieces = i;
	return SUCCESS;

unwind:
	for (j = 0; j < i; j++) {
		ibv_dereg_mr(seg->mrs[j]);
		seg->mrs[j] = NULL;
	}
	ctx->ndescs = first_desc;
	return FAILURE;		// BUG: rdma-mr-leak -- when the descriptor table is full, piece i was already registered and the loop stops below it
}

/* Copy a segment that cannot be pinned in place and expose the copy. */
static int ckpt_stage_segment(struct ckpt_context *ctx, int s)
{
	struct ckpt_segment *seg = &ctx->segs[s];
	struct ckpt_desc d;
	struct ibv_mr *smr;
	void *staging;

	staging = my_malloc(seg->len);
	if (!staging)
		return FAILURE;
	memcpy(staging, seg->addr, seg->len);
	if (ckpt_reg_piece(ctx, staging, seg->len, &smr)) {
		my_free(staging);	// OK: rdma-invalidation-leak -- nothing was registered
		return FAILURE;
	}

	d.addr = (uintptr_t)staging;
	d.len = seg->len;
	d.rkey = smr->rkey;
	d.seg = s;
	if (ckpt_sock_send(ctx->sockfd, &d, sizeof(d)) || ckpt_sock_ack(ctx->sockfd)) {
		fprintf(stderr, " Restore node refused staged segment %d\n", s);
		my_free(staging);	// BUG: rdma-invalidation-leak -- the node may hold the rkey and the registration is still live over freed memory
		return FAILURE;		// BUG: rdma-mr-leak -- 'smr' is never deregistered
	}
	seg->staging = staging;
	seg->mrs[0] = smr;
	seg->npieces = 1;
	return SUCCESS;
}

static void ckpt_unregister_segment(struct ckpt_segment *seg)
{
	int i;

	for (i = 0; i < seg->npieces; i++)
		if (seg->mrs[i])
			ibv_dereg_mr(seg->mrs[i]);
	seg->npieces = 0;
	my_free(seg->staging);	// OK: rdma-invalidation-leak -- the staging registration was deregistered just above
	seg->staging = NULL;
}

static int ckpt_send_table(struct ckpt_context *ctx, int first)
{
	uint32_t n = ctx->ndescs - first;

	if (ckpt_sock_send(ctx->sockfd, &n, sizeof(n)) ||
	    ckpt_sock_send(ctx->sockfd, &ctx->descs[first], n * sizeof(ctx->descs[0])))
		return FAILURE;
	return ckpt_sock_ack(ctx->sockfd);
}

int ckpt_expose_all(struct ckpt_context *ctx)
{
	int s, first = ctx->ndescs;

	for (s = 0; s < ctx->nsegs; s++) {
		int ret = (ctx->segs[s].flags & SEG_F_STAGE) ?
			  ckpt_stage_segment(ctx, s) : ckpt_register_segment(ctx, s);

		if (ret)
			goto unwind;
	}
	if (ckpt_send_table(ctx, first))
		goto unwind;
	return SUCCESS;

unwind:
	while (s-- > 0)		// OK: rdma-mr-leak -- segment s unwound itself; every earlier segment is unregistered here
		ckpt_unregister_segment(&ctx->segs[s]);
	ctx->ndescs = first;
	return FAILURE;
}

/* The restore node pulled everything; drop the copies right away. */
int ckpt_finish_restore(struct ckpt_context *ctx)
{
	char done;
	int s;

	if (read(ctx->sockfd, &done, 1) != 1 || done != 'D')
		return FAILURE;
	for (s = 0; s < ctx->nsegs; s++) {
		if (!ctx->segs[s].staging)
			continue;
		my_free(ctx->segs[s].staging);	// BUG: rdma-invalidation-leak -- the staging copy is freed while its REMOTE_READ registration (key known to the node) is still live
		ctx->segs[s].staging = NULL;
	}
	return SUCCESS;
}

void ckpt_release(struct ckpt_context *ctx)
{
	int s;

	for (s = 0; s < ctx->nsegs; s++)
		ckpt_unregister_segment(&ctx->segs[s]);
	ctx->ndescs = 0;
}

struct ckpt_context *ckpt_ctx_create(struct ibv_device *dev, int sockfd)
{
	struct ckpt_context *ctx = calloc(1, sizeof(*ctx));

	if (!ctx)
		return NULL;
	ctx->sockfd = sockfd;
	ctx->context = ibv_open_device(dev);
	if (!ctx->context) {
		fprintf(stderr, " Couldn't get context for %s\n", ibv_get_device_name(dev));
		goto err_ctx;
	}
	ctx->pd = ibv_alloc_pd(ctx->context);
	if (!ctx->pd)
		goto err_dev;
	ctx->ctrl_buf = my_malloc(CKPT_CTRL_SIZE);
	if (!ctx->ctrl_buf)
		goto err_pd;
	ctx->ctrl_mr = ibv_reg_mr(ctx->pd, ctx->ctrl_buf, CKPT_CTRL_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!ctx->ctrl_mr)
		goto err_buf;
	return ctx;

err_buf:
	my_free(ctx->ctrl_buf);
err_pd:
	ibv_dealloc_pd(ctx->pd);
err_dev:
	ibv_close_device(ctx->context);
err_ctx:
	free(ctx);
	return NULL;
}

int ckpt_ctx_destroy(struct ckpt_context *ctx)
{
	int ret = SUCCESS;

	ckpt_release(ctx);
	my_free(ctx->ctrl_buf);		// OK: rdma-invalidation-leak -- local-only registration, its key never left the process
	if (ibv_dereg_mr(ctx->ctrl_mr)) {
		fprintf(stderr, " Couldn't deregister control MR\n");
		ret = FAILURE;
	}
	if (ibv_dealloc_pd(ctx->pd))
		ret = FAILURE;
	if (ibv_close_device(ctx->context))
		ret = FAILURE;
	free(ctx);
	return ret;
}

int ckpt_add_segment(struct ckpt_context *ctx, void *addr, size_t len, int flags)
{
	struct ckpt_segment *seg;

	if (ctx->nsegs == CKPT_MAX_SEGS)
		return FAILURE;
	seg = &ctx->segs[ctx->nsegs++];
	memset(seg, 0, sizeof(*seg));
	seg->addr = addr;
	seg->len = len;
	seg->flags = flags;
	return SUCCESS;
}
