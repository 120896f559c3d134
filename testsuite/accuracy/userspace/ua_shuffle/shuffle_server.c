/*
 * shuffle_server.c - map-side block server.  A FETCH loads each block from
 * its spill file, registers it for remote read and replies with the keys;
 * RELEASE deregisters and frees.  Correct: unwinding of a partly exposed
 * FETCH, RELEASE order.  Bugs: blocks are registered and deregistered per
 * FETCH, a dropped connection frees blocks before deregistering them, the
 * counters block carries a remote right whose key is never sent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include "shuffle.h"

struct srv_fetch {
	int		used;
	uint32_t	fetch_id;
	unsigned	nblocks;
	void		*data[SHUF_MAX_BLOCKS];
	struct ibv_mr	*mr[SHUF_MAX_BLOCKS];
	struct shuf_msg	reply;
};

struct srv_state {
	const char	*dir;
	struct srv_fetch fetches[SHUF_MAX_INFLIGHT];
	uint64_t	*counters;
	struct ibv_mr	*counters_mr;
};

static void *blk_load(struct srv_state *s, uint64_t id, uint32_t *len)
{
	char path[256];
	void *buf = NULL;
	off_t sz;
	int fd;

	snprintf(path, sizeof(path), "%s/shuffle_%llu.data", s->dir, (unsigned long long)id);
	if ((fd = open(path, O_RDONLY)) < 0)
		return NULL;
	if ((sz = lseek(fd, 0, SEEK_END)) > 0 && (buf = malloc(sz)) && pread(fd, buf, sz, 0) != sz) {
		free(buf);
		buf = NULL;
	}
	close(fd);
	*len = sz;
	return buf;
}

static struct ibv_mr *blk_expose(struct shuf_conn *conn, void *data, uint32_t len)
{
	/* OK: rdma-access-flags-invalid -- REMOTE_READ needs no LOCAL_WRITE */
	return ibv_reg_mr(conn->dev->pd, data, len, IBV_ACCESS_REMOTE_READ); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- every FETCH registers its blocks and sends their rkeys */
}

static void blk_unexpose(struct ibv_mr *mr)
{
	ibv_dereg_mr(mr); /* BUG: rdma-registration-in-datapath -- and every RELEASE deregisters them */
}

int srv_init(struct shuf_conn *conn, const char *dir)
{
	struct srv_state *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->dir = dir;
	s->counters = calloc(64, sizeof(uint64_t));
	/* for remote monitoring */
	s->counters_mr = ibv_reg_mr(conn->dev->pd, s->counters, 64 * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); /* BUG(file): rdma-remote-access-overbroad -- the counters' rkey is never sent to anyone */
	if (!s->counters_mr) {
		free(s->counters);
		free(s);
		return -errno;
	}
	conn->priv = s;
	return 0;
}

static int srv_handle_fetch(struct shuf_conn *conn, struct srv_state *s, struct shuf_msg *msg)
{
	struct srv_fetch *f = NULL;
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *bad;
	struct ibv_sge sge;
	unsigned i;
	uint32_t len;

	for (i = 0; i < SHUF_MAX_INFLIGHT && !f; i++)
		if (!s->fetches[i].used)
			f = &s->fetches[i];
	if (!f || msg->nblocks > SHUF_MAX_BLOCKS)
		return -EBUSY;
	f->used = 1;
	f->fetch_id = msg->fetch_id;
	f->nblocks = msg->nblocks;
	f->reply = (struct shuf_msg){ .type = SHUF_FETCH_REPLY, .fetch_id = msg->fetch_id, .nblocks = msg->nblocks };
	for (i = 0; i < msg->nblocks; i++) {
		f->data[i] = blk_load(s, msg->blocks[i].block_id, &len);
		if (!f->data[i])
			goto unwind;
		f->mr[i] = blk_expose(conn, f->data[i], len);
		if (!f->mr[i]) {
			free(f->data[i]);
			goto unwind;
		}
		f->reply.blocks[i] = (struct shuf_block_desc){ msg->blocks[i].block_id,
			(uintptr_t)f->data[i], len, f->mr[i]->rkey };
	}
	s->counters[0] += msg->nblocks;
	sge = (struct ibv_sge){ (uintptr_t)&f->reply, sizeof(f->reply), 0 };
	wr.wr_id = (uintptr_t)f;
	wr.sg_list = &sge;
	if (ibv_post_send(conn->qp, &wr, &bad) == 0)
		return 0;
unwind:
	while (i--) {
		blk_unexpose(f->mr[i]); /* OK: rdma-mr-leak -- while (i--) releases every block exposed before the failure */
		free(f->data[i]);
	}
	f->used = 0;
	return -EIO;
}

static void srv_handle_release(struct srv_state *s, struct shuf_msg *msg)
{
	struct srv_fetch *f;
	unsigned i, k;

	for (k = 0; k < SHUF_MAX_INFLIGHT; k++) {
		f = &s->fetches[k];
		if (!f->used || f->fetch_id != msg->fetch_id)
			continue;
		for (i = 0; i < f->nblocks; i++) {
			blk_unexpose(f->mr[i]);
			free(f->data[i]); /* OK: rdma-invalidation-leak -- the block's MR is deregistered first */
		}
		f->used = 0;
	}
}

int srv_handle_msg(struct shuf_conn *conn, struct shuf_msg *msg)
{
	struct srv_state *s = conn->priv;

	if (msg->type == SHUF_FETCH)
		return srv_handle_fetch(conn, s, msg);
	if (msg->type == SHUF_RELEASE)
		srv_handle_release(s, msg);
	return 0;
}

/* the reducer went away: drop whatever it still had open */
void srv_conn_cleanup(struct shuf_conn *conn)
{
	struct srv_state *s = conn->priv;
	unsigned i, k;

	for (k = 0; k < SHUF_MAX_INFLIGHT; k++) {
		if (!s->fetches[k].used)
			continue;
		for (i = 0; i < s->fetches[k].nblocks; i++) {
			free(s->fetches[k].data[i]); /* BUG: rdma-invalidation-leak -- the block is freed while its MR (REMOTE_READ, rkey sent in the FETCH reply) is still registered */
			blk_unexpose(s->fetches[k].mr[i]);
		}
	}
	ibv_dereg_mr(s->counters_mr);
	free(s->counters);
	free(s);
}
