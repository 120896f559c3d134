/*
 * nvmf_rdma.h - shared definitions of the yb NVMe-over-Fabrics RDMA target.
 *
 * The target is split in three files:
 *   mem_map.c    per-poll-group memory map: every hugepage region of the
 *                env layer is registered once per protection domain and
 *                translated to an lkey for each I/O,
 *   qpair.c      per-connection resources (command/completion rings and
 *                in-capsule data buffers) and connection accept,
 *   transport.c  devices, poll groups, the request state machine and the
 *                completion handler.
 *
 * The target never hands an rkey to the host: it pulls host data with
 * RDMA READ and pushes controller data with RDMA WRITE.  Only READ sinks
 * need remote rights, and only on iWARP.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-queue-cap-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked -- this program is only annotated for MR lifetime, registration placement and access rights
 */
#ifndef YB_NVMF_RDMA_H
#define YB_NVMF_RDMA_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/queue.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define NVMF_RDMA_MAX_DEVICES		8
#define NVMF_MAX_HUGEPAGES		64
#define NVMF_RDMA_MAX_QUEUE_DEPTH	128
#define NVMF_RDMA_DEFAULT_RX_SGE	2
#define NVMF_IN_CAPSULE_DATA_SIZE	4096
#define NVMF_MAX_IO_SIZE		(128 * 1024)
#define NVMF_ADMIN_POOL_SIZE		(64 * 1024)

#define NVMF_ERRLOG(fmt, ...) \
	fprintf(stderr, "nvmf_rdma: %s: " fmt, __func__, ##__VA_ARGS__)

struct nvme_sgl_keyed {
	uint64_t address;
	uint8_t  length[3];
	uint8_t  key[4];
	uint8_t  type;
};

struct nvme_cmd {
	uint8_t  opc;
	uint8_t  fuse_psdt;
	uint16_t cid;
	uint32_t nsid;
	uint64_t rsvd2;
	uint64_t mptr;
	struct nvme_sgl_keyed dptr;
	uint32_t cdw10[6];
};

struct nvme_cpl {
	uint32_t cdw0;
	uint32_t rsvd1;
	uint16_t sqhd;
	uint16_t sqid;
	uint16_t cid;
	uint16_t status;
};

enum nvmf_rdma_req_state {
	RDMA_REQ_STATE_FREE = 0,
	RDMA_REQ_STATE_NEW,
	RDMA_REQ_STATE_TRANSFERRING_H2C,
	RDMA_REQ_STATE_READY_TO_EXECUTE,
	RDMA_REQ_STATE_EXECUTING,
	RDMA_REQ_STATE_TRANSFERRING_C2H,
	RDMA_REQ_STATE_COMPLETING,
};

struct nvmf_mem_map;

struct nvmf_rdma_device {
	struct ibv_context		*context;
	struct ibv_pd			*pd;
	struct ibv_device_attr		attr;
	enum ibv_transport_type		transport;
	int				index;
};

struct nvmf_rdma_poll_group {
	struct nvmf_rdma_device		*device;
	struct ibv_cq			*cq;
	struct nvmf_mem_map		*map;
	TAILQ_HEAD(, nvmf_rdma_qpair)	qpairs;
};

struct nvmf_rdma_request {
	enum nvmf_rdma_req_state	state;
	struct nvmf_rdma_qpair		*rqpair;
	struct nvme_cmd			*cmd;
	struct nvme_cpl			*cpl;
	void				*data;
	uint32_t			length;
	bool				h2c;
	struct ibv_mr			*adhoc_mr;

	struct ibv_sge			recv_sge;
	struct ibv_recv_wr		recv_wr;
	struct ibv_sge			data_sge;
	struct ibv_send_wr		data_wr;
	struct ibv_sge			rsp_sge;
	struct ibv_send_wr		rsp_wr;

	STAILQ_ENTRY(nvmf_rdma_request)	link;
};

struct nvmf_rdma_qpair {
	struct rdma_cm_id		*cm_id;
	struct ibv_qp			*qp;
	struct nvmf_rdma_poll_group	*pg;
	uint16_t			max_queue_depth;
	uint32_t			sq_outstanding;

	struct nvme_cmd			*cmds;
	struct ibv_mr			*cmds_mr;
	struct nvme_cpl			*cpls;
	struct ibv_mr			*cpls_mr;
	void				*bufs;
	struct ibv_mr			*bufs_mr;

	struct nvmf_rdma_request	*reqs;
	STAILQ_HEAD(, nvmf_rdma_request) free_reqs;
	TAILQ_ENTRY(nvmf_rdma_qpair)	link;
};

/* mem_map.c */
int nvmf_env_add_hugepage(void *vaddr, size_t len);
struct nvmf_mem_map *nvmf_mem_map_create(struct ibv_pd *pd);
int nvmf_mem_map_notify_add(struct nvmf_mem_map *map, void **vaddrs,
			    const size_t *lens, int count);
int nvmf_mem_map_translate(const struct nvmf_mem_map *map, const void *addr,
			   size_t len, uint32_t *lkey);
void nvmf_mem_map_destroy(struct nvmf_mem_map *map);

/* qpair.c */
struct nvmf_rdma_qpair *nvmf_rdma_qpair_create(struct nvmf_rdma_poll_group *pg,
					       struct rdma_cm_id *id,
					       uint16_t depth);
void nvmf_rdma_qpair_destroy(struct nvmf_rdma_qpair *rqpair);
void nvmf_rdma_qpair_destroy_resources(struct nvmf_rdma_qpair *rqpair);

/* transport.c */
int nvmf_rdma_transport_create(void);
void nvmf_rdma_transport_destroy(void);
struct nvmf_rdma_poll_group *nvmf_rdma_poll_group_create(int dev_index);
void nvmf_rdma_poll_group_destroy(struct nvmf_rdma_poll_group *pg);
int nvmf_rdma_poll_group_poll(struct nvmf_rdma_poll_group *pg);
void nvmf_rdma_request_free(struct nvmf_rdma_request *req);

#endif /* YB_NVMF_RDMA_H */
