// RUN: %check_ulplint %s rdma-remote-access-overbroad %t -- -- -I%S/Inputs
// RUN: %check_ulplint --mode=plugin %s rdma-remote-access-overbroad %t.plugin -- -- -I%S/Inputs

// Userspace: remote rights nobody can use, and whole-address-space ODP.

#include <infiniband/verbs.h>
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include "ulp_shared.h"

struct ulp_key_msg {
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

struct ulp_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_mr *staging_mr; /* only ever a local SEND source */
  struct ibv_mr *data_mr;    /* advertised to the peer below */
  void *staging;
  void *data;
  size_t len;
};

/* The staging buffer is only sent from; the peer never learns its rkey. */
int ulp_init_staging(struct ulp_conn *c)
{
  c->staging_mr = ibv_reg_mr(c->pd, c->staging, c->len,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  // CHECK-MESSAGES: :[[@LINE-2]]:19: warning: 'ibv_reg_mr' grants IBV_ACCESS_REMOTE_READ but the MR's rkey never leaves this translation unit; no peer can use these rights, drop them [rdma-remote-access-overbroad]
  return c->staging_mr ? 0 : -1;
}

int ulp_send_staging(struct ulp_conn *c, size_t len)
{
  struct ibv_sge sge = {
      .addr = (uintptr_t)c->staging, .length = len, .lkey = c->staging_mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr *bad;

  return ibv_post_send(c->qp, &wr, &bad);
}

/* A bounce buffer registered, used and released inside one function. */
int ulp_bounce_copy(struct ulp_conn *c, void *tmp, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, tmp, len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  // CHECK-MESSAGES: :[[@LINE-2]]:23: warning: 'ibv_reg_mr' grants IBV_ACCESS_REMOTE_WRITE but the MR's rkey never leaves this function; no peer can use these rights, drop them [rdma-remote-access-overbroad]
  struct ibv_sge sge = {.addr = (uintptr_t)tmp, .length = len, .lkey = 0};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
  struct ibv_send_wr *bad;
  int ret;

  if (!mr)
    return -1;
  sge.lkey = mr->lkey;
  ret = ibv_post_send(c->qp, &wr, &bad);
  ibv_dereg_mr(mr);
  return ret;
}

/* Implicit ODP: the whole address space, open to the peer. */
struct ibv_mr *ulp_reg_everything(struct ulp_conn *c)
{
  return ibv_reg_mr(c->pd, NULL, SIZE_MAX,
                    IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  // CHECK-MESSAGES: :[[@LINE-3]]:10: warning: implicit ODP registration of the whole address space grants IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ; any peer holding the rkey can reach all of the process's memory, register the buffers the peer needs instead [rdma-remote-access-overbroad]
}

/* Near misses. */

/* The data MR's rkey goes into a message for the peer. */
int ok_advertise(struct ulp_conn *c, struct ulp_key_msg *msg)
{
  c->data_mr = ibv_reg_mr(c->pd, c->data, c->len,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!c->data_mr)
    return -1;
  msg->addr = htobe64((uintptr_t)c->data);
  msg->rkey = htobe32(c->data_mr->rkey);
  msg->len = htobe32(c->len);
  return 0;
}

/* The MR handle escapes to code this file cannot see. */
void ulp_publish(struct ibv_mr *mr);
int ok_escapes(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr)
    return -1;
  ulp_publish(mr);
  return 0;
}

/* A struct from a shared header: another file may send the rkey. */
int ok_shared_struct(struct ulp_shared_conn *s)
{
  s->exported_mr = ibv_reg_mr(s->pd, s->buf, s->len,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  return s->exported_mr ? 0 : -1;
}

/* ODP of one buffer, not of the address space. */
struct ibv_mr *ok_odp_buffer(struct ulp_conn *c)
{
  return ibv_reg_mr(c->pd, c->data, c->len,
                    IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
                        IBV_ACCESS_REMOTE_WRITE);
}

/* Local rights only. */
int ok_local_only(struct ulp_conn *c, void *tmp, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, tmp, len, IBV_ACCESS_LOCAL_WRITE);
  if (!mr)
    return -1;
  return ibv_dereg_mr(mr);
}
