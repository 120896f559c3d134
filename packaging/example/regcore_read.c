/*
 * regcore_read: a complete regcore program. It reads 64 KiB from a peer's
 * memory with one RDMA READ context and checks every byte. regcore picks
 * the strategy for the device (a plain READ, an MR per I/O, staging...)
 * and registers the local buffer itself (lkey 0): the program never calls
 * ibv_reg_mr.
 *
 * Built against the installed packages, on simverbs (no RDMA hardware):
 *   cc regcore_read.c $(pkg-config --cflags --libs regcore-sim) -o regcore_read
 *   cmake (CMakeLists.txt here): find_package(regcore), regcore::sim
 * On real hardware or rxe/siw, link regcore instead (pkg-config regcore,
 * regcore::regcore) and connect the QP to a real peer; the simverbs_*
 * calls below stand in for that peer.
 *
 *   ./regcore_read [mthca|mlx4|mlx5|iwarp]
 */
#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BYTES (64 * 1024)

static int fail(const char *what, int err)
{
	fprintf(stderr, "regcore_read: %s: %s (%s)\n", what, regcore_strerror(err),
		regcore_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	static unsigned char remote[BYTES], local[BYTES];
	const char *profile = argc > 1 ? argv[1] : "mlx5";
	struct regcore_attr attr = { .max_ctxs = 4 };
	struct ibv_qp_init_attr qp_attr = { 0 };
	struct regcore_rw_ctx *ctx;
	struct regcore *core;
	struct ibv_qp *qp;
	struct ibv_wc wc;
	uint32_t rkey, sq;
	int err, n, i, wrs;

	if (simverbs_set_profile_by_name(profile))
		return fail("unknown device profile", -EINVAL);
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *dev = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	if (list)
		ibv_free_device_list(list);
	struct ibv_pd *pd = dev ? ibv_alloc_pd(dev) : NULL;
	if (!pd)
		return fail("no device", -ENODEV);

	/* The core, and a QP sized by regcore for 4 contexts. */
	if ((err = regcore_open(pd, &attr, &core)))
		return fail("regcore_open", err);
	if ((err = regcore_max_send_wr(core, 1, 4, &sq)))
		return fail("regcore_max_send_wr", err);
	struct ibv_cq *cq = ibv_create_cq(dev, (int)sq + 8, NULL, NULL, 0);
	qp_attr.send_cq = qp_attr.recv_cq = cq;
	qp_attr.qp_type = IBV_QPT_RC;
	qp_attr.cap.max_send_wr = 1;
	qp_attr.cap.max_recv_wr = 1;
	qp_attr.cap.max_send_sge = qp_attr.cap.max_recv_sge = 1;
	if ((err = regcore_qp_create(core, &qp_attr, 4, &qp)))
		return fail("regcore_qp_create", err);

	/* The peer: its memory, and the key it hands out. */
	struct simverbs_peer *peer = simverbs_peer_create(dev);
	for (i = 0; i < BYTES; i++)
		remote[i] = (unsigned char)(i * 7 + 3);
	if (simverbs_peer_expose(peer, remote, BYTES, IBV_ACCESS_LOCAL_WRITE |
				 IBV_ACCESS_REMOTE_READ, &rkey) ||
	    simverbs_peer_connect(peer, qp))
		return fail("peer", -EIO);

	/* One READ: lkey 0 lets regcore register the sink. */
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = BYTES, .lkey = 0 };
	wrs = regcore_rw_ctx_init(&ctx, core, qp, &sge, 1, (uintptr_t)remote,
				  rkey, REGCORE_DIR_READ);
	if (wrs < 0)
		return fail("regcore_rw_ctx_init", wrs);
	if ((err = regcore_rw_ctx_post(ctx, qp, 42, NULL)))
		return fail("regcore_rw_ctx_post", err);
	for (i = 0; i < 1000 && (n = regcore_poll_cq(core, cq, 1, &wc)) == 0; i++)
		;
	if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 42)
		return fail("completion", n < 0 ? n : -EIO);
	printf("read %d bytes on %s with %s (%d work requests): %s\n", BYTES,
	       profile, regcore_rw_strategy_name(regcore_rw_ctx_strategy(ctx)),
	       wrs,
	       memcmp(local, remote, BYTES) ? "MISMATCH" : "ok");
	err = memcmp(local, remote, BYTES) != 0;

	regcore_rw_ctx_destroy(ctx);
	regcore_qp_destroy(core, qp);
	simverbs_peer_destroy(peer);
	if (regcore_close(core))
		return fail("regcore_close", -EBUSY);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(dev);
	return err;
}
