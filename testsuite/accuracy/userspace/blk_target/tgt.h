/*
 * tgt: a block target over RDMA.  tgt_mem.c owns the data-buffer pool
 * (registered once, handed out per command); tgt_io.c owns the queue pair,
 * the command handling and the data movement (RDMA WRITE to the host for
 * reads, RDMA READ from the host for writes) and the response SEND.
 */
#ifndef TGT_H
#define TGT_H

#include <infiniband/verbs.h>
#include <stdint.h>

#define TGT_DEPTH	128
#define TGT_BUF_SIZE	(128 * 1024)
#define TGT_MAX_SGE	8

struct tgt_buf {
	struct tgt_buf *next;
	char           *data;
};

struct tgt_pool {
	struct ibv_pd  *pd;
	char           *area;
	struct ibv_mr  *mr;
	struct tgt_buf  bufs[TGT_DEPTH];
	struct tgt_buf *free;
};

int tgt_pool_init(struct tgt_pool *p, struct ibv_pd *pd);
struct tgt_buf *tgt_buf_get(struct tgt_pool *p);
void tgt_buf_put(struct tgt_pool *p, struct tgt_buf *b);
void tgt_pool_fini(struct tgt_pool *p);

#endif
