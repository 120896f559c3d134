/*
 * wb_iw_pull.c - bulk file pull over RC, for InfiniBand, RoCE and iWARP.
 *
 * The server reads the file into memory, registers it for remote read and
 * SENDs a manifest (address, rkey, length).  The client first READs the
 * 4 KiB file header, then pulls the body in segments into a ring of
 * slots; each slot scatters a segment over PULL_SUBBUFS sub-buffers (each
 * behind a block header for O_DIRECT writes).  Many iWARP adapters take a
 * single SGE per READ, so on iWARP a segment is PULL_SUBBUFS READs.  A
 * progress note (SEND) follows every segment; every PULL_SIG_EVERY-th note
 * is signaled and retires the slots before it.
 *
 * The sink rights are picked per transport in the code itself, and the
 * header sink was registered for local write only.  The client's send
 * queue is sized for the READs but not for the note behind them, and the
 * server's receive queue is a fixed 4096 entries.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-rkey-reuse, rdma-unmap-before-invalidate, rdma-local-mr-management, rdma-send-queue-manual-factor -- not reviewed here
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdbool.h>
#include <errno.h>
#include <infiniband/verbs.h>

#define PULL_SUBBUFS	4
#define PULL_SUB_SIZE	(64 * 1024)
#define PULL_BLK_HDR	4096
#define PULL_SLOT_SIZE	(PULL_SUBBUFS * (PULL_BLK_HDR + PULL_SUB_SIZE))
#define PULL_SEG_SIZE	(PULL_SUBBUFS * PULL_SUB_SIZE)
#define PULL_META_SIZE	4096
#define PULL_SIG_EVERY	8
#define PULL_SRV_RX	4096
#define PULL_CLI_RX	4

#define MIN(a, b)	((a) < (b) ? (a) : (b))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))

struct pull_manifest {
	uint64_t	addr;
	uint64_t	len;
	uint32_t	rkey;
	uint32_t	pad;
};

struct pull_note {
	uint64_t	seq;
	uint64_t	off;
};

struct pull_dev {
	struct ibv_context	*ctx;
	struct ibv_device_attr	 attr;
	struct ibv_pd		*pd;
	bool			 iwarp;
	unsigned		 rd_sge;
};

struct pull_slot {
	char			*area;
	struct ibv_mr		*mr;
	uint64_t		 seq;
	bool			 busy;
	struct ibv_sge		 sge[PULL_SUBBUFS];
	struct ibv_send_wr	 rd[PULL_SUBBUFS];
	struct ibv_send_wr	 note_wr;
	struct ibv_sge		 note_sge;
	struct pull_note	 note;
};

struct pull_client {
	struct pull_dev		*dev;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	unsigned		 depth;
	struct pull_slot	*ring;
	char			*meta;
	struct ibv_mr		*meta_mr;
	struct pull_manifest	 man;
	uint64_t		 next_seq;
	uint64_t		 done_seq;
	unsigned		 since_sig;
};

struct pull_server {
	struct pull_dev		*dev;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	char			*file;
	size_t			 file_len;
	struct ibv_mr		*file_mr;
	struct pull_note	*notes;
	struct ibv_mr		*notes_mr;
	struct pull_manifest	 man;
};

/* out-of-band QP connection and the block writer live in pull_util.c */
int pull_connect_qp(struct ibv_qp *qp, int port);
int pull_store(uint64_t off, const struct ibv_sge *sge, int nsge);

int pull_dev_open(struct pull_dev *dev, struct ibv_device *ibdev)
{
	dev->ctx = ibv_open_device(ibdev);
	if (!dev->ctx)
		return -ENODEV;
	if (ibv_query_device(dev->ctx, &dev->attr))
		return -errno;
	/* OK: rdma-access-flags-transport -- the transport only limits the SGEs per READ here */
	dev->iwarp = ibdev->transport_type == IBV_TRANSPORT_IWARP;
	dev->rd_sge = dev->iwarp ? 1 : MIN(dev->attr.max_sge_rd, PULL_SUBBUFS);
	if (dev->rd_sge == 0)
		dev->rd_sge = 1;
	dev->pd = ibv_alloc_pd(dev->ctx);
	return dev->pd ? 0 : -ENOMEM;
}

static int client_create_qp(struct pull_client *c)
{
	struct pull_dev *dev = c->dev;
	struct ibv_qp_init_attr attr;

	if (c->depth * PULL_SUBBUFS > (unsigned)dev->attr.max_qp_wr)
		c->depth = dev->attr.max_qp_wr / PULL_SUBBUFS;
	c->cq = ibv_create_cq(dev->ctx, c->depth * PULL_SUBBUFS + PULL_CLI_RX, NULL, NULL, 0);
	if (!c->cq)
		return -ENOMEM;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	/* BUG(file): rdma-send-queue-undersized -- a segment is up to PULL_SUBBUFS READs plus the progress SEND chained behind them */
	attr.cap.max_send_wr = PULL_SUBBUFS * c->depth;
	attr.cap.max_recv_wr = PULL_CLI_RX;
	attr.cap.max_send_sge = MIN(PULL_SUBBUFS, dev->attr.max_sge);
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct pull_note);
	c->qp = ibv_create_qp(dev->pd, &attr);
	return c->qp ? 0 : -errno;
}

static int client_ring_alloc(struct pull_client *c)
{
	struct pull_dev *dev = c->dev;
	int acc = IBV_ACCESS_LOCAL_WRITE;
	unsigned i;

	/* READ responses are tagged writes on iWARP */
	if (dev->ctx->device->transport_type == IBV_TRANSPORT_IWARP)
		acc |= IBV_ACCESS_REMOTE_WRITE;

	c->ring = calloc(c->depth, sizeof(*c->ring));
	if (!c->ring)
		return -ENOMEM;
	for (i = 0; i < c->depth; i++) {
		struct pull_slot *s = &c->ring[i];

		s->area = aligned_alloc(4096, PULL_SLOT_SIZE);
		if (!s->area)
			goto unwind;
		/* BUG: rdma-access-flags-transport -- the sink rights come from an inline IBV_TRANSPORT_IWARP test */
		s->mr = ibv_reg_mr(dev->pd, s->area, PULL_SLOT_SIZE, acc); /* OK: rdma-registration-in-datapath, rdma-remote-access-overbroad -- the whole ring, once, before pulling starts; REMOTE_WRITE only where iWARP READ sinks need it */
		if (!s->mr) {
			free(s->area);
			goto unwind;
		}
	}

	c->meta = aligned_alloc(4096, PULL_META_SIZE);
	if (!c->meta)
		goto unwind;
	/* OK: rdma-registration-in-datapath -- once per client, kept next to the QP */
	c->meta_mr = ibv_reg_mr(dev->pd, c->meta, PULL_META_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!c->meta_mr)
		goto unwind_meta;
	return 0;

unwind_meta:
	free(c->meta);
unwind:
	while (i--) {
		ibv_dereg_mr(c->ring[i].mr);
		free(c->ring[i].area);
	}
	free(c->ring);
	return -ENOMEM;
}

static int client_read_header(struct pull_client *c)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)c->meta,
		.length = PULL_META_SIZE,
		.lkey = c->meta_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = UINT64_MAX,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = c->man.addr, .rkey = c->man.rkey },
	}, *bad;
	struct ibv_wc wc;
	int n;

	/* BUG: rdma-access-flags-transport -- meta_mr has no REMOTE_WRITE; on iWARP this READ cannot place its response */
	if (ibv_post_send(c->qp, &wr, &bad))
		return -1;
	while ((n = ibv_poll_cq(c->cq, 1, &wc)) == 0)
		;
	return n < 0 || wc.status != IBV_WC_SUCCESS ? -EIO : 0;
}

/* Build the READ chain of one slot for the segment at @off. */
static void client_build_slot(struct pull_client *c, struct pull_slot *s, uint64_t off)
{
	unsigned nrd = DIV_ROUND_UP(PULL_SUBBUFS, c->dev->rd_sge);
	unsigned j, k;

	for (j = 0; j < PULL_SUBBUFS; j++) {
		s->sge[j].addr = (uintptr_t)(s->area + j * (PULL_BLK_HDR + PULL_SUB_SIZE) + PULL_BLK_HDR);
		s->sge[j].length = PULL_SUB_SIZE;
		s->sge[j].lkey = s->mr->lkey;
	}
	for (j = 0, k = 0; j < nrd; j++, k += c->dev->rd_sge) {
		memset(&s->rd[j], 0, sizeof(s->rd[j]));
		s->rd[j].opcode = IBV_WR_RDMA_READ;
		s->rd[j].sg_list = &s->sge[k];
		s->rd[j].num_sge = c->dev->rd_sge;
		s->rd[j].wr.rdma.remote_addr = c->man.addr + PULL_META_SIZE + off + (uint64_t)k * PULL_SUB_SIZE;
		s->rd[j].wr.rdma.rkey = c->man.rkey;
		s->rd[j].next = j + 1 < nrd ? &s->rd[j + 1] : &s->note_wr;
	}

	s->note.seq = s->seq;
	s->note.off = off;
	s->note_sge.addr = (uintptr_t)&s->note;
	s->note_sge.length = sizeof(s->note);
	s->note_sge.lkey = 0;
	memset(&s->note_wr, 0, sizeof(s->note_wr));
	s->note_wr.wr_id = s->seq;
	s->note_wr.opcode = IBV_WR_SEND;
	s->note_wr.sg_list = &s->note_sge;
	s->note_wr.num_sge = 1;
	s->note_wr.send_flags = IBV_SEND_INLINE;
}

static int client_post_slot(struct pull_client *c, struct pull_slot *s, uint64_t off, bool last)
{
	struct ibv_send_wr *bad;

	s->seq = ++c->next_seq;
	s->busy = true;
	client_build_slot(c, s, off);
	/* OK: rdma-unsignaled-send-starvation -- since_sig counts every segment; every PULL_SIG_EVERY-th note and the last are signaled */
	if (++c->since_sig >= MIN(PULL_SIG_EVERY, c->depth) || last) {
		s->note_wr.send_flags |= IBV_SEND_SIGNALED;
		c->since_sig = 0;
	}
	return ibv_post_send(c->qp, &s->rd[0], &bad);
}

/* Pull an arbitrary range straight into the caller's buffer (resume, repair). */
int pull_read_range(struct pull_client *c, void *dst, uint64_t off, uint32_t len)
{
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int n, ret = -EIO;

	/* BUG: rdma-registration-in-datapath -- the caller's buffer is registered for this one READ */
	mr = ibv_reg_mr(c->dev->pd, dst, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-access-flags-transport, rdma-remote-access-overbroad -- READ sink, REMOTE_WRITE on every transport */
	if (!mr)
		return -errno;
	sge.addr = (uintptr_t)dst;
	sge.length = len;
	sge.lkey = mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = UINT64_MAX - 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = c->man.addr + PULL_META_SIZE + off;
	wr.wr.rdma.rkey = c->man.rkey;
	if (ibv_post_send(c->qp, &wr, &bad))
		goto out;
	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.wr_id != wr.wr_id));
	if (n > 0 && wc.status == IBV_WC_SUCCESS)
		ret = 0;
out:
	ibv_dereg_mr(mr);
	return ret;
}

int pull_client_run(struct pull_client *c, const struct pull_manifest *man)
{
	struct ibv_wc wc[16];
	uint64_t off = 0, stored = 0;
	unsigned i, next = 0;
	int n, k;

	c->man = *man;
	if (client_create_qp(c) || client_ring_alloc(c))
		return -1;
	if (pull_connect_qp(c->qp, 1) || client_read_header(c))
		return -1;

	while (stored < c->man.len) {
		while (off < c->man.len && !c->ring[next].busy) {
			if (client_post_slot(c, &c->ring[next], off,
					     off + PULL_SEG_SIZE >= c->man.len))
				return -1;
			off += PULL_SEG_SIZE;
			next = (next + 1) % c->depth;
		}
		n = ibv_poll_cq(c->cq, 16, wc);
		if (n < 0)
			return -1;
		for (k = 0; k < n; k++) {
			if (wc[k].status != IBV_WC_SUCCESS)
				return -1;
			if (wc[k].opcode == IBV_WC_SEND && wc[k].wr_id > c->done_seq)
				c->done_seq = wc[k].wr_id;
		}
		for (i = 0; i < c->depth; i++) {
			struct pull_slot *s = &c->ring[i];

			if (s->busy && s->seq <= c->done_seq) {
				pull_store(s->note.off, s->sge, PULL_SUBBUFS);
				stored += PULL_SEG_SIZE;
				s->busy = false;
			}
		}
	}
	return 0;
}

int pull_server_setup(struct pull_server *s, char *file, size_t len)
{
	struct pull_dev *dev = s->dev;
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.cap = {
			.max_send_wr = 4,
			/* BUG(file): rdma-queue-cap-unchecked -- 4096 receives for progress notes, never compared with max_qp_wr */
			.max_recv_wr = PULL_SRV_RX,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = sizeof(struct pull_manifest),
		},
	};
	unsigned i;

	s->file = file;
	s->file_len = len;
	s->cq = ibv_create_cq(dev->ctx, PULL_SRV_RX + 4, NULL, NULL, 0);
	if (!s->cq)
		return -ENOMEM;
	attr.send_cq = s->cq;
	attr.recv_cq = s->cq;
	s->qp = ibv_create_qp(dev->pd, &attr);
	if (!s->qp)
		return -errno;

	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- remote read alone needs no LOCAL_WRITE; the rkey goes out in the manifest */
	s->file_mr = ibv_reg_mr(dev->pd, file, len, IBV_ACCESS_REMOTE_READ);
	s->notes = calloc(PULL_SRV_RX, sizeof(*s->notes));
	if (!s->file_mr || !s->notes)
		return -ENOMEM;
	s->notes_mr = ibv_reg_mr(dev->pd, s->notes, PULL_SRV_RX * sizeof(*s->notes),
				 IBV_ACCESS_LOCAL_WRITE);
	if (!s->notes_mr)
		return -ENOMEM;
	for (i = 0; i < PULL_SRV_RX; i++) {
		struct ibv_sge sge = {
			.addr = (uintptr_t)&s->notes[i], .length = sizeof(s->notes[i]),
			.lkey = s->notes_mr->lkey,
		};
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_recv(s->qp, &wr, &bad))
			return -1;
	}
	s->man.addr = (uintptr_t)file;
	s->man.len = len - PULL_META_SIZE;
	s->man.rkey = s->file_mr->rkey;
	return pull_connect_qp(s->qp, 1);
}

int pull_server_send_manifest(struct pull_server *s)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&s->man, .length = sizeof(s->man), .lkey = 0,
	};
	/* OK: rdma-unsignaled-send-starvation -- the server QP signals every WR (sq_sig_all = 1) */
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE,
	}, *bad;

	return ibv_post_send(s->qp, &wr, &bad);
}
