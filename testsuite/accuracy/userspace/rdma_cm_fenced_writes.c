/*
 * ckptw: writes application checkpoints into a checkpoint server's region
 * with rdma_post_write() over an rdma_cm connection.  Each checkpoint is a
 * series of WRITEs; the last one carries IBV_SEND_FENCE so that the
 * server's "checkpoint complete" flag lands after the data, and the
 * writer learns that the server consumed the checkpoint by RDMA-READing a
 * flag word back.  No completion is ever requested on the send side: the
 * endpoint was created with sq_sig_all = 0, the WRITEs pass 0 or
 * IBV_SEND_FENCE, and the READ passes IBV_SEND_FENCE too.  After
 * max_send_wr work requests the connection is stuck.
 *
 * Correct: the data source and the flag word are registered once per
 * connection; the READ sink (the flag word) is registered with
 * rdma_reg_write(), which includes REMOTE_WRITE, as iWARP needs.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#define CKPT_CHUNK	(1u << 20)

struct ckptw {
	struct rdma_cm_id *id;
	char              *data;
	size_t             data_len;
	struct ibv_mr     *data_mr;
	uint64_t           flag;
	struct ibv_mr     *flag_mr;
	uint64_t           srv_addr, srv_flag_addr;
	uint32_t           srv_rkey;
};

int ckptw_connect(struct ckptw *w, struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = 128;
	attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	// BUG(file): rdma-unsignaled-send-starvation -- requested-only signaling; every post passes 0 or IBV_SEND_FENCE
	attr.sq_sig_all = 0;
	if (rdma_create_ep(&w->id, res, NULL, &attr))
		return -errno;
	w->data_mr = rdma_reg_msgs(w->id, w->data, w->data_len); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITEs
	if (!w->data_mr)
		goto err_ep;
	/* OK: rdma-access-flags-invalid -- rdma_reg_write() includes LOCAL_WRITE */
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE on a READ sink is what iWARP needs */
	w->flag_mr = rdma_reg_write(w->id, &w->flag, sizeof(w->flag)); // BUG: rdma-local-mr-management -- the flag word is the sink of the ULP's own READ
	if (!w->flag_mr)
		goto err_data;
	if (rdma_connect(w->id, NULL))
		goto err_flag;
	return 0;
err_flag:
	rdma_dereg_mr(w->flag_mr);
err_data:
	rdma_dereg_mr(w->data_mr);
err_ep:
	rdma_destroy_ep(w->id);
	return -EIO;
}

int ckptw_write(struct ckptw *w)
{
	size_t off;

	for (off = 0; off < w->data_len; off += CKPT_CHUNK) {
		size_t n = w->data_len - off < CKPT_CHUNK ? w->data_len - off : CKPT_CHUNK;
		int flags = off + n == w->data_len ? IBV_SEND_FENCE : 0;

		if (rdma_post_write(w->id, NULL, w->data + off, n, w->data_mr, flags,
				    w->srv_addr + off, w->srv_rkey))
			return -errno;
	}
	/* OK: rdma-access-flags-transport -- the flag word was registered with rdma_reg_write() (REMOTE_WRITE) */
	return rdma_post_read(w->id, NULL, &w->flag, sizeof(w->flag), w->flag_mr,
			      IBV_SEND_FENCE, w->srv_flag_addr, w->srv_rkey);
}
