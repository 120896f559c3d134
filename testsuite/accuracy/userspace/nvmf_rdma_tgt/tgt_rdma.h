/*
 * tgt_rdma.h - RDMA transport of a user-space NVMe-oF target.
 *
 * One request object per queue slot.  A request moves the command's data
 * with RDMA READs (host writes) or RDMA WRITEs (host reads) built in its
 * data.wr[] array, one work request per keyed SGL descriptor of the
 * command, and completes with a SEND of the NVMe completion.
 */
#ifndef TGT_RDMA_H
#define TGT_RDMA_H

#include <stdint.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define TGT_MAX_SGL_DESC        4
#define TGT_IO_UNIT_SIZE        (128 * 1024)
#define TGT_IN_CAPSULE_SIZE     4096
#define TGT_DEFAULT_TX_SGE      16

struct nvme_sgl_keyed {
	uint64_t        address;
	uint32_t        length;
	uint32_t        key;
};

struct nvme_cmd {
	uint8_t                 opc;
	uint8_t                 nsgl;
	uint16_t                cid;
	uint32_t                nsid;
	uint64_t                slba;
	struct nvme_sgl_keyed   sgl[TGT_MAX_SGL_DESC];
};

struct nvme_cpl {
	uint32_t        cdw0;
	uint16_t        sqid;
	uint16_t        cid;
	uint16_t        status;
	uint16_t        rsvd;
};

struct tgt_resources {
	struct nvme_cmd *cmds;
	struct ibv_mr   *cmds_mr;
	struct nvme_cpl *cpls;
	struct ibv_mr   *cpls_mr;
	char            *bufs;          /* in-capsule data, one per slot */
	struct ibv_mr   *bufs_mr;
};

struct tgt_request {
	struct tgt_rdma_qpair   *qpair;
	uint16_t                 slot;
	int                      state;
	struct nvme_cmd         *cmd;
	struct nvme_cpl         *cpl;
	void                    *buf;    /* data pool buffer, or the backend's own */
	int                      zcopy;
	int                      in_capsule;
	uint32_t                 length;
	struct {
		struct ibv_send_wr  wr[TGT_MAX_SGL_DESC];
		struct ibv_sge      sge[TGT_MAX_SGL_DESC];
		int                 num_wrs;
	} data;
	struct ibv_sge           rsp_sge;
	struct ibv_send_wr       rsp_wr;
	struct ibv_recv_wr       recv_wr;
	struct ibv_sge           recv_sge;
};

struct tgt_rdma_qpair {
	struct rdma_cm_id       *cm_id;
	struct ibv_qp           *qp;
	struct ibv_pd           *pd;
	uint16_t                 max_queue_depth;
	struct tgt_resources    *res;
	struct tgt_request      *reqs;
};

/* tgt_qpair.c */
int tgt_data_pool_init(struct ibv_pd *pd, size_t len);
void tgt_data_pool_fini(void);
uint32_t tgt_data_lkey(void);
void *tgt_data_buf_get(void);
void tgt_data_buf_put(void *buf);
int tgt_qpair_create(struct tgt_rdma_qpair *rq, struct ibv_cq *cq);
int tgt_qpair_alloc_resources(struct tgt_rdma_qpair *rq);
void tgt_qpair_destroy(struct tgt_rdma_qpair *rq);

/* tgt_io.c */
int tgt_request_exec(struct tgt_request *req, void *backend_buf);
void tgt_request_backend_done(struct tgt_request *req);
void tgt_process_send_cq(struct tgt_rdma_qpair *rq, struct ibv_wc *wc, int n);

#endif
