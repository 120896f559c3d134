/*
 * An NVMe-oF/iSER-style initiator on regcore's C API: each command's data
 * lives in three scattered buffers, advertised to the target as one keyed
 * SGL descriptor (address, length, one rkey). The target (simverbs' peer,
 * played by this program) moves the data with one RDMA WRITE or READ and
 * answers, invalidating the key with SEND_WITH_INV where the key allows
 * it; the initiator releases the key with the response's completion.
 *
 *   sgl_initiator [--profile=mlx5|mlx4|mthca|iwarp] [--commands=N]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#define PIECES 3
#define PIECE_LEN 1024
#define CTXS 4

/* The command capsule: opcode and one keyed SGL descriptor. */
struct capsule {
	uint32_t opcode; /* 1: the target writes our buffers, 2: it reads them */
	uint32_t key;
	uint64_t addr;
	uint32_t length;
};

struct initiator {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	struct regcore *core;
	struct simverbs_peer *target;
	char resp[CTXS][64];
	struct regcore_mr *resp_mr;
};

static void die(const char *what)
{
	fprintf(stderr, "sgl_initiator: %s: %s\n", what, regcore_last_error());
	exit(1);
}

static void setup(struct initiator *in, const char *profile)
{
	struct ibv_device **list;
	struct regcore_attr attr = { .max_ctxs = CTXS };
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC };
	uint32_t sq;

	if (simverbs_set_profile_by_name(profile))
		die("unknown profile");
	list = ibv_get_device_list(NULL);
	in->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	in->pd = ibv_alloc_pd(in->ctx);
	if (regcore_open(in->pd, &attr, &in->core))
		die("regcore_open");
	if (regcore_max_send_wr(in->core, 1, CTXS, &sq))
		die("regcore_max_send_wr");
	in->scq = ibv_create_cq(in->ctx, (int)sq, NULL, NULL, 0);
	in->rcq = ibv_create_cq(in->ctx, CTXS, NULL, NULL, 0);
	qa.send_cq = in->scq;
	qa.recv_cq = in->rcq;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = CTXS;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = sizeof(struct capsule);
	if (regcore_qp_create(in->core, &qa, CTXS, &in->qp))
		die("regcore_qp_create");
	in->target = simverbs_peer_create(in->ctx);
	if (simverbs_peer_connect(in->target, in->qp))
		die("connect");
	if (regcore_mr_get(in->core, in->resp, sizeof in->resp, IBV_ACCESS_LOCAL_WRITE, &in->resp_mr))
		die("regcore_mr_get");
}

static void post_response_buffer(struct initiator *in, int slot)
{
	struct ibv_sge sge = { (uintptr_t)in->resp[slot], 64, in->resp_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(in->qp, &wr, &bad))
		die("ibv_post_recv");
}

static int poll_one(struct initiator *in, struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 100000; i++)
		if (regcore_poll_cq(in->core, cq, 1, wc) == 1)
			return wc->status == IBV_WC_SUCCESS ? 0 : -EIO;
	return -ETIMEDOUT;
}

/* The target: moves the data through the descriptor, then answers. */
static int target_serves(struct initiator *in, int invalidate, unsigned char *data)
{
	struct capsule c;
	size_t len;
	int err;

	if (simverbs_peer_recv(in->target, &c, sizeof c, &len))
		return -EPROTO;
	if (c.opcode == 1)
		err = simverbs_peer_rdma_write(in->target, c.key, c.addr, data, c.length);
	else
		err = simverbs_peer_rdma_read(in->target, c.key, c.addr, data, c.length);
	if (err)
		return err;
	return simverbs_peer_send(in->target, "done", 5, invalidate ? c.key : 0);
}

static void on_released(struct regcore_reg_ctx *ctx, int status, void *arg)
{
	(void)ctx;
	(void)status;
	++*(int *)arg;
}

/* One command; returns 0 when the data arrived and the key is dead. */
static int command(struct initiator *in, uint32_t opcode, unsigned seq, int *remote_invs)
{
	static unsigned char arena[PIECES * 8192];
	unsigned char data[PIECES * PIECE_LEN];
	struct iovec iov[PIECES];
	struct regcore_reg_ctx *ctx;
	struct capsule c = { .opcode = opcode };
	struct ibv_sge sge = { (uintptr_t)&c, sizeof c, 0 };
	struct ibv_send_wr send = { .wr_id = seq, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				    .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	struct ibv_wc wc;
	uint32_t invalidated;
	int released = 0, ret, i;

	for (i = 0; i < PIECES; i++) {
		iov[i].iov_base = arena + i * 8192 + 64 * (seq % 8);
		iov[i].iov_len = PIECE_LEN;
		memset(iov[i].iov_base, opcode == 2 ? (int)(seq + i) : 0, PIECE_LEN);
	}
	for (i = 0; i < (int)sizeof data; i++)
		data[i] = (unsigned char)(seq * 7 + i);
	ret = regcore_reg_ctx_init_iov(&ctx, in->core, in->qp, iov, PIECES,
				       opcode == 1 ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ);
	if (ret)
		return ret;
	regcore_reg_ctx_rkey(ctx, &c.key, &c.addr);
	c.length = PIECES * PIECE_LEN;
	post_response_buffer(in, (int)(seq % CTXS));
	if ((ret = regcore_reg_ctx_post(ctx, &send)) || (ret = poll_one(in, in->scq, &wc)))
		return ret;
	if ((ret = target_serves(in, regcore_reg_ctx_remote_inv_ok(ctx), data)) ||
	    (ret = poll_one(in, in->rcq, &wc)))
		return ret;
	invalidated = (wc.wc_flags & IBV_WC_WITH_INV) ? wc.invalidated_rkey : 0;
	*remote_invs += invalidated == c.key;
	ret = regcore_reg_ctx_release(ctx, invalidated, on_released, &released);
	if (ret == -EINPROGRESS)
		ret = regcore_poll_cq(in->core, in->scq, 1, &wc) == 0 && released == 1 ? 0 : -EIO;
	if (ret)
		return ret;
	if (simverbs_peer_rdma_read(in->target, c.key, c.addr, data, 1) == 0)
		return -EKEYREJECTED; /* the key outlived the command */
	for (i = 0; i < PIECES; i++) {
		const unsigned char *want = opcode == 1 ? data + i * PIECE_LEN : iov[i].iov_base;
		const unsigned char *got = opcode == 1 ? iov[i].iov_base : data + i * PIECE_LEN;
		if (memcmp(want, got, PIECE_LEN))
			return -EBADMSG;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *profile = "mlx5";
	unsigned commands = 100, seq;
	struct initiator in;
	struct regcore_stats st;
	int remote_invs = 0, err;

	for (int i = 1; i < argc; i++) {
		if (!strncmp(argv[i], "--profile=", 10))
			profile = argv[i] + 10;
		else if (!strncmp(argv[i], "--commands=", 11))
			commands = (unsigned)atoi(argv[i] + 11);
		else
			return fprintf(stderr, "usage: %s [--profile=NAME] [--commands=N]\n", argv[0]), 2;
	}
	memset(&in, 0, sizeof in);
	setup(&in, profile);
	for (seq = 1; seq <= commands; seq++) {
		err = command(&in, seq % 2 ? 1 : 2, seq, &remote_invs);
		if (err) {
			fprintf(stderr, "command %u: %s (%s)\n", seq, regcore_strerror(err), regcore_last_error());
			return 1;
		}
	}
	regcore_get_stats(in.core, &st);
	printf("profile=%s commands=%u keyed-sgl=%s remote_invalidations=%d local_invalidations=%llu\n",
	       profile, commands,
	       regcore_reg_strategy_name(st.reg_ctxs[REGCORE_REG_INDIRECT] ? REGCORE_REG_INDIRECT : REGCORE_REG_STAGED),
	       remote_invs, (unsigned long long)(st.local_invs + st.sync_invalidations));
	printf("data ok, every key dead after its command\n");
	regcore_mr_put(in.core, in.resp_mr);
	regcore_qp_destroy(in.core, in.qp);
	simverbs_peer_destroy(in.target);
	if (regcore_close(in.core))
		die("regcore_close");
	ibv_destroy_cq(in.scq);
	ibv_destroy_cq(in.rcq);
	ibv_dealloc_pd(in.pd);
	ibv_close_device(in.ctx);
	return 0;
}
