/*
 * mlib: the send side of a small message-passing library over RC verbs.
 * Small messages are copied into bounce buffers carved from pool chunks;
 * each chunk is registered once (LOCAL_WRITE) when the pool grows and kept
 * until the endpoint is destroyed.  Messages larger than a bounce buffer
 * are sent zero-copy: the caller's buffer is registered for that one SEND
 * and deregistered when the SEND completes.
 *
 * Correct: chunks are registered once and kept on the endpoint's chunk
 * list; sends are signaled every MLIB_SIG_INTERVAL-th post with a counter
 * the post path advances, and zero-copy sends are always signaled.
 * Not correct: a failed descriptor allocation in mlib_pool_grow() returns
 * with the chunk's MR still registered, and the zero-copy path registers
 * and deregisters once per message (should go through a registration
 * cache).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MLIB_BOUNCE_SIZE	(8 * 1024)
#define MLIB_BUFS_PER_CHUNK	32
#define MLIB_SIG_INTERVAL	16

struct mlib_chunk {
	struct mlib_chunk *next;
	struct ibv_mr     *mr;
	char              *mem;
};

struct mlib_buf {
	struct mlib_buf *next_free;
	char            *data;
	uint32_t         lkey;
};

enum mlib_desc_kind { MLIB_DESC_BOUNCE, MLIB_DESC_ZCOPY };

struct mlib_desc {
	struct mlib_desc   *next;	/* posted, not yet retired */
	enum mlib_desc_kind kind;
	struct mlib_buf    *buf;	/* bounce */
	struct ibv_mr      *zmr;	/* zero-copy */
	unsigned int        retire;	/* unsignaled posts retired by this one */
	void              (*cb)(void *arg, int status);
	void               *arg;
};

struct mlib_ep {
	struct ibv_pd     *pd;
	struct ibv_qp     *qp;
	struct ibv_cq     *cq;
	unsigned int       depth;
	unsigned int       sq_used;
	unsigned int       unsig;
	struct mlib_chunk *chunks;
	struct mlib_buf   *free_bufs;
	struct mlib_desc  *pend_head, *pend_tail;
};

int mlib_ep_create(struct mlib_ep *ep, struct ibv_pd *pd, struct ibv_cq *cq,
		   unsigned int depth)
{
	struct ibv_qp_init_attr attr;

	memset(ep, 0, sizeof(*ep));
	ep->pd = pd;
	ep->cq = cq;
	ep->depth = depth;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- one SEND per message, sq_used keeps at most depth posted */
	attr.cap.max_send_wr = ep->depth;
	attr.cap.max_recv_wr = ep->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	ep->qp = ibv_create_qp(pd, &attr);
	return ep->qp ? 0 : -errno;
}

int mlib_pool_grow(struct mlib_ep *ep)
{
	struct mlib_chunk *ch;
	struct mlib_buf *bufs;
	struct ibv_mr *mr;
	char *mem;
	int i;

	mem = aligned_alloc(4096, MLIB_BOUNCE_SIZE * MLIB_BUFS_PER_CHUNK);
	if (!mem)
		return -ENOMEM;
	/* OK: rdma-local-mr-management -- bounce chunk registered once for SEND/RECV */
	/* OK: rdma-registration-in-datapath -- pool growth: the chunk stays registered for the endpoint's life */
	mr = ibv_reg_mr(ep->pd, mem, MLIB_BOUNCE_SIZE * MLIB_BUFS_PER_CHUNK,
			IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		free(mem);
		return -errno;
	}
	bufs = calloc(MLIB_BUFS_PER_CHUNK, sizeof(*bufs));
	ch = malloc(sizeof(*ch));
	if (!bufs || !ch) {
		free(bufs);
		free(ch);
		free(mem);
		return -ENOMEM; // BUG: rdma-mr-leak -- 'mr' is still registered on this error return
	}
	for (i = 0; i < MLIB_BUFS_PER_CHUNK; i++) {
		bufs[i].data = mem + (size_t)i * MLIB_BOUNCE_SIZE;
		bufs[i].lkey = mr->lkey;
		bufs[i].next_free = ep->free_bufs;
		ep->free_bufs = &bufs[i];
	}
	ch->mr = mr;
	ch->mem = mem;
	ch->next = ep->chunks;
	ep->chunks = ch;
	/* OK: rdma-mr-leak -- the MR is kept on ep->chunks and released in mlib_ep_destroy() */
	return 0;
}

static int mlib_post(struct mlib_ep *ep, struct mlib_desc *d, struct ibv_sge *sge,
		     int force_signal)
{
	struct ibv_send_wr wr, *bad;

	if (ep->sq_used >= ep->depth)
		return -EAGAIN;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)d;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = sge;
	wr.num_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- unsig advances on every unsignaled post */
	if (force_signal || ep->unsig + 1 >= MLIB_SIG_INTERVAL) {
		wr.send_flags = IBV_SEND_SIGNALED;
		d->retire = ep->unsig + 1;
		ep->unsig = 0;
	} else {
		ep->unsig++;
		d->retire = 0;
	}
	if (ibv_post_send(ep->qp, &wr, &bad))
		return -EIO;
	ep->sq_used++;
	d->next = NULL;
	if (ep->pend_tail)
		ep->pend_tail->next = d;
	else
		ep->pend_head = d;
	ep->pend_tail = d;
	return 0;
}

static void mlib_desc_put(struct mlib_ep *ep, struct mlib_desc *d)
{
	if (d->kind == MLIB_DESC_ZCOPY) {
		ibv_dereg_mr(d->zmr); // BUG: rdma-registration-in-datapath -- deregistration once per large message (completion and failed-post paths)
	} else {
		d->buf->next_free = ep->free_bufs;
		ep->free_bufs = d->buf;
	}
	free(d);
}

int mlib_send(struct mlib_ep *ep, const void *msg, uint32_t len,
	      void (*cb)(void *, int), void *arg)
{
	struct mlib_desc *d;
	struct ibv_sge sge;
	int ret;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->cb = cb;
	d->arg = arg;

	if (len <= MLIB_BOUNCE_SIZE) {
		if (!ep->free_bufs && mlib_pool_grow(ep)) {
			free(d);
			return -ENOMEM;
		}
		d->kind = MLIB_DESC_BOUNCE;
		d->buf = ep->free_bufs;
		ep->free_bufs = d->buf->next_free;
		memcpy(d->buf->data, msg, len);
		sge.addr = (uintptr_t)d->buf->data;
		sge.lkey = d->buf->lkey;
		sge.length = len;
		ret = mlib_post(ep, d, &sge, 0);
	} else {
		d->kind = MLIB_DESC_ZCOPY;
		// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the user buffer is registered for every large message
		d->zmr = ibv_reg_mr(ep->pd, (void *)msg, len, IBV_ACCESS_LOCAL_WRITE);
		if (!d->zmr) {
			free(d);
			return -errno;
		}
		sge.addr = (uintptr_t)msg;
		sge.lkey = d->zmr->lkey;
		sge.length = len;
		ret = mlib_post(ep, d, &sge, 1);
	}
	/* OK: rdma-mr-leak -- a failed post releases the descriptor and its MR */
	if (ret)
		mlib_desc_put(ep, d);
	return ret;
}

/* a signaled completion retires it and every unsignaled send posted before it */
void mlib_send_done(struct mlib_ep *ep, struct ibv_wc *wc)
{
	struct mlib_desc *last = (struct mlib_desc *)(uintptr_t)wc->wr_id;
	int status = wc->status == IBV_WC_SUCCESS ? 0 : -EIO;
	struct mlib_desc *d;

	ep->sq_used -= last->retire;
	do {
		d = ep->pend_head;
		ep->pend_head = d->next;
		if (!ep->pend_head)
			ep->pend_tail = NULL;
		if (d->cb)
			d->cb(d->arg, status);
		mlib_desc_put(ep, d);
	} while (d != last);
}

void mlib_ep_destroy(struct mlib_ep *ep)
{
	struct mlib_chunk *ch;

	ibv_destroy_qp(ep->qp);
	while ((ch = ep->chunks)) {
		ep->chunks = ch->next;
		ibv_dereg_mr(ch->mr);
		free(ch->mem);
		free(ch);
	}
}
