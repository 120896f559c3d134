// RUN: %check_ulplint %s rdma-local-mr-management %t -- -- -I%srcroot/regcore/include
// RUN: %check_ulplint --mode=plugin %s rdma-local-mr-management %t.plugin -- -- -I%srcroot/regcore/include

// Userspace initiator and target code that registers memory by hand next
// to code that already lets regcore do it.

#include <endian.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <regcore/regcore.h>
#include <stdint.h>
#include <string.h>

struct ulp_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct regcore *core;
  char *ring;
  struct ibv_mr *ring_mr;
};

struct ulp_cmd {
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

struct ulp_req {
  struct ulp_conn *conn;
  void *buf;
  size_t len;
  struct ibv_mr *mr;
  struct ibv_mw *mw;
  struct ulp_cmd *cmd;
  struct ibv_send_wr bind_wr;
  struct ibv_send_wr send_wr;
  struct ibv_sge sge;
};

/* 1. Initiator: each I/O buffer registered for the peer, rkey in the
 * command. */
int ulp_expose_buffer(struct ulp_req *req)
{
  req->mr = ibv_reg_mr(req->conn->pd, req->buf, req->len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  // CHECK-MESSAGES: :[[@LINE-2]]:13: warning: 'ibv_reg_mr' registers memory to give the peer a key to local memory; the ULP manages registration itself; use regcore_reg_ctx_init/_rkey/_post/_release (a remote-registration context per I/O) [rdma-local-mr-management]
  if (!req->mr)
    return -errno;
  req->cmd->addr = htobe64((uintptr_t)req->buf);
  req->cmd->rkey = htobe32(req->mr->rkey);
  req->cmd->len = htobe32((uint32_t)req->len);
  return 0;
}

/* 2. Initiator with a type-2 window bound per I/O in front of the SEND. */
int ulp_bind_window(struct ulp_req *req, struct ibv_mr *data_mr)
{
  struct ibv_send_wr *bad;

  if (!req->mw) {
    req->mw = ibv_alloc_mw(req->conn->pd, IBV_MW_TYPE_2);
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'ibv_alloc_mw' allocates a memory window to give the peer a key to local memory; the ULP manages registration itself; use regcore_reg_ctx_init
    if (!req->mw)
      return -errno;
  }
  memset(&req->bind_wr, 0, sizeof(req->bind_wr));
  req->bind_wr.opcode = IBV_WR_BIND_MW;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'IBV_WR_BIND_MW' posts a registration work request to give the peer a key to local memory; the ULP manages registration itself; use regcore_reg_ctx_init
  req->bind_wr.bind_mw.mw = req->mw;
  req->bind_wr.bind_mw.rkey = ibv_inc_rkey(req->mw->rkey);
  req->bind_wr.bind_mw.bind_info.mr = data_mr;
  req->bind_wr.bind_mw.bind_info.addr = (uintptr_t)req->buf;
  req->bind_wr.bind_mw.bind_info.length = req->len;
  req->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  req->bind_wr.next = &req->send_wr;
  req->cmd->rkey = htobe32(req->bind_wr.bind_mw.rkey);
  return ibv_post_send(req->conn->qp, &req->bind_wr, &bad);
}

/* 3. Target: a staging buffer registered by hand for its RDMA READs. */
struct ulp_target_io {
  struct ulp_conn *conn;
  void *staging;
  struct ibv_mr *staging_mr;
  struct ibv_sge sge;
  struct ibv_send_wr read_wr;
};

int ulp_target_setup(struct ulp_target_io *io, size_t bytes)
{
  io->staging_mr = ibv_reg_mr(io->conn->pd, io->staging, bytes,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  // CHECK-MESSAGES: :[[@LINE-2]]:20: warning: 'ibv_reg_mr' registers memory for its own RDMA READ/WRITE; the ULP manages registration itself; use regcore_rw_ctx_init/_post/_destroy
  return io->staging_mr ? 0 : -errno;
}

int ulp_target_fetch(struct ulp_target_io *io, const struct ulp_cmd *cmd)
{
  struct ibv_send_wr *bad;

  io->sge.addr = (uintptr_t)io->staging;
  io->sge.length = be32toh(cmd->len);
  io->sge.lkey = io->staging_mr->lkey;
  memset(&io->read_wr, 0, sizeof(io->read_wr));
  io->read_wr.opcode = IBV_WR_RDMA_READ;
  io->read_wr.sg_list = &io->sge;
  io->read_wr.num_sge = 1;
  io->read_wr.send_flags = IBV_SEND_SIGNALED;
  io->read_wr.wr.rdma.remote_addr = be64toh(cmd->addr);
  io->read_wr.wr.rdma.rkey = be32toh(cmd->rkey);
  return ibv_post_send(io->conn->qp, &io->read_wr, &bad);
}

/* Near misses. */

/* The receive ring: registered once for local access, not per I/O. */
int ulp_ring_setup(struct ulp_conn *c, size_t bytes)
{
  c->ring_mr = ibv_reg_mr(c->pd, c->ring, bytes, IBV_ACCESS_LOCAL_WRITE);
  return c->ring_mr ? 0 : -errno;
}

/* Deregistration pairs with a registration reported above. */
void ulp_unexpose(struct ulp_req *req)
{
  ibv_dereg_mr(req->mr);
  req->mr = NULL;
}

/* Already migrated: the core gives the key and moves the data. */
int ulp_expose_with_core(struct ulp_req *req, struct regcore_reg_ctx **ctx)
{
  uint32_t rkey;
  uint64_t addr;
  int ret;

  ret = regcore_reg_ctx_init(ctx, req->conn->core, req->conn->qp, req->buf,
                             req->len, IBV_ACCESS_REMOTE_WRITE);
  if (ret)
    return ret;
  ret = regcore_reg_ctx_rkey(*ctx, &rkey, &addr);
  if (ret)
    return ret;
  req->cmd->addr = htobe64(addr);
  req->cmd->rkey = htobe32(rkey);
  return regcore_reg_ctx_post(*ctx, &req->send_wr);
}

int ulp_target_fetch_with_core(struct ulp_target_io *io, struct regcore_rw_ctx **ctx,
                               const struct ulp_cmd *cmd)
{
  struct ibv_sge sge = {(uintptr_t)io->staging, be32toh(cmd->len), 0};
  int ret;

  ret = regcore_rw_ctx_init(ctx, io->conn->core, io->conn->qp, &sge, 1,
                            be64toh(cmd->addr), be32toh(cmd->rkey),
                            REGCORE_DIR_READ);
  if (ret < 0)
    return ret;
  return regcore_rw_ctx_post(*ctx, io->conn->qp, 1, NULL);
}
