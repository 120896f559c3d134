/*
 * nh: NVMe-oF-like RDMA host (initiator) that exposes each I/O's data
 * buffer through a type-2 memory window.  Shared declarations for
 * nh_qpair.c (queue setup), nh_mw.c (window helpers) and nh_io.c
 * (submission, completion, timeouts).
 */
#ifndef NH_H
#define NH_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

#define NH_WRS_PER_REQ	3	/* BIND_MW, command SEND, LOCAL_INV */

struct nh_cmd {
	uint16_t cid;
	uint8_t  opc;
	uint8_t  flags;
	uint32_t nsid;
	uint64_t slba;
	uint64_t addr;
	uint32_t key;
	uint32_t len;
};

struct nh_req {
	struct nh_req      *next_free;
	uint16_t            cid;
	bool                busy;
	struct ibv_mw      *mw;
	uint32_t            key;
	void               *data;
	uint32_t            len;
	uint64_t            deadline_ms;
	struct nh_cmd       cmd;
	struct ibv_sge      cmd_sge;
	struct ibv_send_wr  bind_wr, cmd_wr, inv_wr;
	void              (*cb)(struct nh_req *, int);
};

struct nh_qpair {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *data_mr;	/* I/O buffers, LOCAL_WRITE | MW_BIND */
	struct ibv_mr      *cmd_mr;
	unsigned int        depth;
	struct nh_req      *reqs;
	struct nh_req      *free_reqs;
};

int nh_qpair_create(struct nh_qpair *q, unsigned int depth);
int nh_mw_alloc_all(struct nh_qpair *q);
void nh_mw_free_all(struct nh_qpair *q);
void nh_mw_prep_bind(struct nh_qpair *q, struct nh_req *r, bool host_to_ctrl);
bool nh_mw_check_inv(const struct nh_req *r, uint32_t invalidated_rkey);
int nh_mw_local_inv(struct nh_qpair *q, struct nh_req *r, unsigned int send_flags);
void nh_req_free(struct nh_qpair *q, struct nh_req *r);

#endif
