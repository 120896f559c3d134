/*
 * umr_setup.c: QP, buffers and mkeys of the UMR benchmark.
 *
 * Correct: the send queue takes the device's max_qp_wr (no per-request
 * factor); mkeys are created in a loop unwound on failure; the data buffer
 * is registered once with local write only (the mkeys carry the remote
 * access); mlx5-only code.
 */
#include "umr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int umr_setup(struct umr_bench *b)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr_ex attr;
	struct mlx5dv_qp_init_attr dv;
	struct mlx5dv_mkey_init_attr ma = {
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = UMR_SEGS,
	};
	int i;

	if (ibv_query_device(b->ctx, &dattr))
		return -errno;
	memset(&attr, 0, sizeof(attr));
	memset(&dv, 0, sizeof(dv));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = b->cq;
	attr.recv_cq = b->cq;
	attr.pd = b->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-manual-factor, rdma-queue-cap-unchecked -- the device's own maximum */
	attr.cap.max_send_wr = dattr.max_qp_wr;
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 64;
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST | MLX5DV_QP_EX_WITH_MR_INTERLEAVED;
	b->qp = mlx5dv_create_qp(b->ctx, &attr, &dv);
	if (!b->qp)
		return -errno;
	b->qpx = ibv_qp_to_qp_ex(b->qp);
	b->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(b->qpx);

	b->data = aligned_alloc(4096, (size_t)UMR_NKEYS * UMR_SEGS * UMR_SEG_SIZE);
	if (!b->data)
		goto err_qp;
	/* OK: rdma-local-mr-management -- registered once for local access; the mkeys built over it are reported where they are made */
	b->data_mr = ibv_reg_mr(b->pd, b->data, (size_t)UMR_NKEYS * UMR_SEGS * UMR_SEG_SIZE,
				IBV_ACCESS_LOCAL_WRITE);
	if (!b->data_mr)
		goto err_data;

	ma.pd = b->pd;
	for (i = 0; i < UMR_NKEYS; i++) {
		b->mkey[i] = mlx5dv_create_mkey(&ma); // BUG: rdma-local-mr-management -- mkeys created by the ULP to expose memory
		if (!b->mkey[i])
			goto err_mkeys;
	}
	return 0;

err_mkeys:
	while (i--)
		mlx5dv_destroy_mkey(b->mkey[i]);
	ibv_dereg_mr(b->data_mr);
err_data:
	free(b->data);
err_qp:
	ibv_destroy_qp(b->qp);
	return -ENOMEM;
}

void umr_teardown(struct umr_bench *b)
{
	int i;

	ibv_destroy_qp(b->qp);
	for (i = 0; i < UMR_NKEYS; i++)
		mlx5dv_destroy_mkey(b->mkey[i]);
	ibv_dereg_mr(b->data_mr);
	free(b->data);
}
