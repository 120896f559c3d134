/*
 * blkdemo: runs one version of the example ULP (initiator and target, each
 * with its own connection) on simverbs and reports what a peer could still
 * do afterwards. Built twice, against ../handmade and ../regcore.
 *
 *   blkdemo [--profile=mthca|mlx4|mlx5|iwarp] [--ios=N] [--fail-post=I]
 *
 * Even I/Os write a pattern to block i/2, odd ones read the block back and
 * check it (zeros if the write failed); blocks wrap around the disk. --fail-post=I makes the device reject the first work
 * request of I/O I's submission. After every I/O, failed or not, the rkey
 * the initiator advertised must be dead: the target side tries an RDMA READ
 * with it, as a misbehaving peer would.
 */
#include "blkrdma.h"

#include <errno.h>
#include <simverbs/simverbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IO_BYTES 8192
#define DEMO_BLOCKS (BLK_DISK_SIZE / IO_BYTES)

struct demo {
	struct ibv_context *ctx;
	struct blk_conn init, tgt;
	struct blk_target_io *io;
	struct blk_request reqs[BLK_QUEUE_DEPTH];
	char *bufs;
	char written[DEMO_BLOCKS];	/* LBA blocks the target has stored */
	int failures, leaked_keys;
};

static int demo_open(struct demo *d)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	unsigned int i;

	if (!list || !list[0])
		return -ENODEV;
	d->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!d->ctx)
		return -ENODEV;
	if (blk_conn_create(&d->init, d->ctx, BLK_QUEUE_DEPTH) ||
	    blk_conn_create(&d->tgt, d->ctx, BLK_QUEUE_DEPTH))
		return -EIO;
	if (simverbs_qp_connect(d->init.qp, d->tgt.qp->qp_num) ||
	    simverbs_qp_connect(d->tgt.qp, d->init.qp->qp_num))
		return -EIO;
	d->io = blk_target_create(&d->tgt);
	if (!d->io)
		return -EIO;
	for (i = 0; i < BLK_QUEUE_DEPTH; i++)
		if (blk_conn_post_recv(&d->init, i) || blk_conn_post_recv(&d->tgt, i))
			return -EIO;
	d->bufs = calloc(BLK_QUEUE_DEPTH, IO_BYTES);
	for (i = 0; i < BLK_QUEUE_DEPTH; i++) {
		d->reqs[i].conn = &d->init;
		d->reqs[i].tag = i;
		d->reqs[i].buf = d->bufs + (size_t)i * IO_BYTES;
		d->reqs[i].len = IO_BYTES;
	}
	return d->bufs ? 0 : -ENOMEM;
}

/* Polls both sides once; returns completions seen or a negative error. */
static int demo_poll(struct demo *d)
{
	struct ibv_wc wc[8];
	int n, i, seen = 0, ret;

	n = blk_conn_poll(&d->tgt, wc, 8);
	for (i = 0; i < n; i++) {
		ret = blk_target_handle(d->io, &wc[i]);
		if (ret)
			return ret;
	}
	seen += n > 0 ? n : 0;
	n = blk_conn_poll(&d->init, wc, 8);
	for (i = 0; i < n; i++) {
		ret = blk_initiator_handle(&d->init, &wc[i], d->reqs);
		if (ret)
			return ret;
	}
	return seen + (n > 0 ? n : 0);
}

/* Drives both sides until the request is done or nothing moves any more. */
static int demo_wait(struct demo *d, struct blk_request *req)
{
	int idle = 0, ret;

	while (!req->done && idle < 100) {
		ret = demo_poll(d);
		if (ret < 0)
			return ret;
		idle = ret ? 0 : idle + 1;
	}
	return req->done ? 0 : -ETIMEDOUT;
}

/* A peer that kept the key tries to read the buffer with it. */
static void demo_check_key(struct demo *d, int i, struct blk_request *req)
{
	if (!req->rkey || simverbs_key_query(d->init.pd, req->rkey, NULL) == -ENOKEY)
		return;
	printf("io %d: BUG: rkey 0x%x still grants the peer access after the I/O ended\n",
	       i, req->rkey);
	d->leaked_keys++;
}

static void demo_fill(char *buf, int block)
{
	for (int b = 0; b < IO_BYTES; b++)
		buf[b] = (char)(block * 31 + b);
}

static int demo_io(struct demo *d, int i, int fail_post)
{
	struct blk_request *req = &d->reqs[i % BLK_QUEUE_DEPTH];
	enum blk_opcode op = i % 2 ? BLK_CMD_READ : BLK_CMD_WRITE;
	int block = (i / 2) % DEMO_BLOCKS;
	uint64_t lba = (uint64_t)block * (IO_BYTES / BLK_SECTOR);
	char expect[IO_BYTES];
	int ret;

	if (op == BLK_CMD_WRITE || d->written[block])
		demo_fill(expect, block);
	else
		memset(expect, 0, IO_BYTES); /* the disk starts zeroed */
	if (op == BLK_CMD_WRITE)
		memcpy(req->buf, expect, IO_BYTES);
	else
		memset(req->buf, 0, IO_BYTES);
	req->rkey = 0;
	if (fail_post)
		simverbs_fault_inject(SIMVERBS_FAULT_POST_FAIL, 1, ENOMEM);
	ret = blk_submit(req, op, lba);
	if (!ret)
		ret = demo_wait(d, req);
	else if (req->rkey) /* let a release in flight finish */
		for (int round = 0; round < 100 && demo_poll(d) >= 0; round++)
			;
	simverbs_fault_clear();
	if (ret)
		printf("io %d (%s): failed: %s%s%s\n", i, op == BLK_CMD_READ ? "READ" : "WRITE",
		       strerror(-ret), ret == -EIO ? ": " : "",
		       ret == -EIO ? simverbs_last_error() : "");
	else if (req->status)
		printf("io %d: target status %d\n", i, req->status), ret = -EIO;
	else if (op == BLK_CMD_READ && memcmp(req->buf, expect, IO_BYTES))
		printf("io %d: READ returned wrong data\n", i), ret = -EIO;
	if (ret)
		d->failures++;
	else if (op == BLK_CMD_WRITE)
		d->written[block] = 1;
	demo_check_key(d, i, req);
	return ret;
}

int main(int argc, char **argv)
{
	struct demo d;
	int ios = 8, fail_at = -1, i;

	memset(&d, 0, sizeof(d));
	for (i = 1; i < argc; i++) {
		if (!strncmp(argv[i], "--profile=", 10)) {
			if (simverbs_set_profile_by_name(argv[i] + 10)) {
				fprintf(stderr, "blkdemo: unknown profile '%s'\n", argv[i] + 10);
				return 2;
			}
		} else if (!strncmp(argv[i], "--ios=", 6)) {
			ios = atoi(argv[i] + 6);
		} else if (!strncmp(argv[i], "--fail-post=", 12)) {
			fail_at = atoi(argv[i] + 12);
		} else {
			fprintf(stderr, "usage: blkdemo [--profile=NAME] [--ios=N] [--fail-post=I]\n");
			return 2;
		}
	}
	if (demo_open(&d)) {
		fprintf(stderr, "blkdemo: setup failed: %s\n", simverbs_last_error());
		return 2;
	}
	for (i = 0; i < ios; i++)
		demo_io(&d, i, i == fail_at);
	printf("ios=%d failed=%d leaked_keys=%d\n", ios, d.failures, d.leaked_keys);
	blk_target_destroy(d.io);
	blk_conn_destroy(&d.tgt);
	blk_conn_destroy(&d.init);
	ibv_close_device(d.ctx);
	free(d.bufs);
	return d.failures || d.leaked_keys ? 1 : 0;
}
