/*
 * smbd_user: a user-space SMB-Direct-like transport.  The client exposes
 * I/O buffers for the server's RDMA READ/WRITE through type-2 windows
 * taken from a per-connection list ("MRs" in SMB-Direct terms).
 * smbd_mr.c: window list, register (bind) and deregister (LOCAL_INV,
 * waited for), remote-invalidation check; smbd_io.c: QP, the read/write
 * request path and its completion.
 */
#ifndef SMBD_H
#define SMBD_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

struct smbd_mr {
	struct smbd_mr *next;
	struct ibv_mw  *mw;
	uint32_t        key;
	bool            bound;
	void           *buf;
	uint32_t        len;
};

struct smbd_conn {
	struct ibv_pd  *pd;
	struct ibv_cq  *cq;
	struct ibv_qp  *qp;
	struct ibv_mr  *io_mr;		/* LOCAL_WRITE | MW_BIND over the I/O arena */
	struct ibv_mr  *pkt_mr;
	unsigned int    send_credits;
	unsigned int    max_mrs;
	struct smbd_mr *mrs;
	struct smbd_mr *free_mrs;
};

int smbd_mr_list_init(struct smbd_conn *c);
struct smbd_mr *smbd_register_mr(struct smbd_conn *c, void *buf, uint32_t len, bool writable);
int smbd_deregister_mr(struct smbd_conn *c, struct smbd_mr *mr);
void smbd_put_mr(struct smbd_conn *c, struct smbd_mr *mr);
bool smbd_check_remote_inv(const struct smbd_mr *mr, uint32_t rkey);

#endif
