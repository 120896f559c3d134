/*
 * umr_bench: measures indirect-mkey (UMR) registration throughput on
 * ConnectX adapters.  umr_setup.c creates the mlx5dv QP, buffers and
 * mkeys; umr_post.c runs the registration loop (configure, expose to the
 * peer, invalidate) in list, interleaved and atomic modes.
 */
#ifndef UMR_BENCH_H
#define UMR_BENCH_H

#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <stdint.h>

#define UMR_NKEYS	64
#define UMR_SEGS	8
#define UMR_SEG_SIZE	4096

enum umr_mode { UMR_MODE_LIST, UMR_MODE_INTERLEAVED, UMR_MODE_ATOMIC };

struct umr_bench {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	struct mlx5dv_qp_ex *mqpx;
	char                *data;
	struct ibv_mr       *data_mr;
	struct mlx5dv_mkey  *mkey[UMR_NKEYS];
	enum umr_mode        mode;
};

int umr_setup(struct umr_bench *b);
int umr_run(struct umr_bench *b, unsigned int iters);
void umr_teardown(struct umr_bench *b);

#endif
