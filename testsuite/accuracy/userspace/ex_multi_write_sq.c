/*
 * tilesync: synchronizes tiles of a distributed array.  A tile update is
 * one ibv_wr_start()/ibv_wr_complete() batch with two RDMA WRITEs (the
 * tile body and its halo row) and a SEND carrying the tile version; the
 * SEND is signaled and retires the WRITEs.  Up to `window` updates are in
 * flight.
 *
 * Not correct: max_send_wr = window + 1 dates from when an update was a
 * single WRITE_WITH_IMM; each update is three work requests now.
 * Correct: signaling (the closing SEND of every batch is signaled); the
 * tile buffers are registered once by the array layer (not here).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

struct tilesync {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	unsigned int        window;
	uint32_t            tile_lkey;
	uint64_t            peer_base;
	uint32_t            peer_rkey;
};

int tilesync_create_qp(struct tilesync *t)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = t->cq;
	attr.recv_cq = t->cq;
	attr.pd = t->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;
	// BUG(file): rdma-send-queue-undersized -- each update posts WRITE + WRITE + SEND, the queue reserves one per update
	attr.cap.max_send_wr = t->window + 1;
	attr.cap.max_recv_wr = t->window;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 16;
	t->qp = ibv_create_qp_ex(t->ctx, &attr);
	if (!t->qp)
		return -errno;
	t->qpx = ibv_qp_to_qp_ex(t->qp);
	return 0;
}

int tilesync_update(struct tilesync *t, uint64_t tile_off, void *tile, uint32_t tile_len,
		    void *halo, uint32_t halo_len, uint64_t version)
{
	ibv_wr_start(t->qpx);
	t->qpx->wr_id = version;
	t->qpx->wr_flags = 0;
	ibv_wr_rdma_write(t->qpx, t->peer_rkey, t->peer_base + tile_off);
	ibv_wr_set_sge(t->qpx, t->tile_lkey, (uintptr_t)tile, tile_len);
	t->qpx->wr_flags = 0;
	ibv_wr_rdma_write(t->qpx, t->peer_rkey, t->peer_base + tile_off + tile_len);
	ibv_wr_set_sge(t->qpx, t->tile_lkey, (uintptr_t)halo, halo_len);
	/* OK: rdma-unsignaled-send-starvation -- the closing SEND is signaled */
	t->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(t->qpx);
	ibv_wr_set_inline_data(t->qpx, &version, sizeof(version));
	return ibv_wr_complete(t->qpx);
}
