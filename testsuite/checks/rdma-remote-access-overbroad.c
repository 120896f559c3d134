// RUN: %check_ulplint %s rdma-remote-access-overbroad %t -- -- -I%S/Inputs
// RUN: %check_ulplint --mode=plugin %s rdma-remote-access-overbroad %t.plugin -- -- -I%S/Inputs

// Userspace: remote rights nobody can use, and whole-address-space ODP.

#include <infiniband/verbs.h>
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

/* Implicit ODP kept in the connection, its rkey used by nobody: one finding
 * (the whole address space), not a second one for the unused rights. */
struct ulp_odp_conn {
  struct ibv_pd *pd;
  struct ibv_mr *odp_mr;
};

int ulp_enable_odp(struct ulp_odp_conn *c)
{
  c->odp_mr = ibv_reg_mr(c->pd, NULL, SIZE_MAX,
                         IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
                             IBV_ACCESS_REMOTE_READ);
  // CHECK-MESSAGES: :[[@LINE-3]]:15: warning: implicit ODP registration of the whole address space grants IBV_ACCESS_REMOTE_READ; any peer holding the rkey can reach all of the process's memory, register the buffers the peer needs instead [rdma-remote-access-overbroad]
  return c->odp_mr ? 0 : -1;
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

/* Buffers registered by role through one helper that maps the role to its
 * rights: each call is judged with the rights its role selects. */
enum ulp_role { ULP_ROLE_SEND, ULP_ROLE_RECV, ULP_ROLE_TARGET };

static unsigned int ulp_role_access(enum ulp_role role)
{
  switch (role) {
  case ULP_ROLE_SEND:
    return 0;
  case ULP_ROLE_RECV:
    return IBV_ACCESS_LOCAL_WRITE;
  case ULP_ROLE_TARGET:
    return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  }
  return 0;
}

struct ulp_pool {
  struct ibv_pd *pd;
  void *send_area, *recv_area, *scratch;
  size_t len;
  struct ibv_mr *send_mr, *recv_mr, *scratch_mr;
};

int ulp_pool_init(struct ulp_pool *p)
{
  p->send_mr = ibv_reg_mr(p->pd, p->send_area, p->len,
                          ulp_role_access(ULP_ROLE_SEND));
  if (!p->send_mr)
    return -1;
  p->recv_mr = ibv_reg_mr(p->pd, p->recv_area, p->len,
                          ulp_role_access(ULP_ROLE_RECV));
  if (!p->recv_mr)
    return -1;
  /* Registered as a target "for later"; its key is never advertised. */
  p->scratch_mr = ibv_reg_mr(p->pd, p->scratch, p->len,
                             ulp_role_access(ULP_ROLE_TARGET));
  // CHECK-MESSAGES: :[[@LINE-2]]:19: warning: 'ibv_reg_mr' grants IBV_ACCESS_REMOTE_WRITE but the MR's rkey never leaves this translation unit; no peer can use these rights, drop them [rdma-remote-access-overbroad]
  return p->scratch_mr ? 0 : -1;
}

/* Data regions registered as the memory map reports them and looked up per
 * request. On iWARP an RDMA READ's sink needs REMOTE_WRITE: the responder
 * places the data with the sink's key, so the right is used although no
 * message carries the key. */
struct ulp_region {
  void *base;
  size_t len;
  struct ibv_mr *mr;
};

struct ulp_target {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ulp_region regions[16];
  int nregions;
  struct ibv_sge sge;
  struct ibv_send_wr wr;
};

int ulp_target_add_region(struct ulp_target *t, void *base, size_t len)
{
  struct ulp_region *r = &t->regions[t->nregions];
  int access = IBV_ACCESS_LOCAL_WRITE;

  if (t->ctx->device->transport_type == IBV_TRANSPORT_IWARP)
    access |= IBV_ACCESS_REMOTE_WRITE; /* READ sinks on iWARP */
  r->mr = ibv_reg_mr(t->pd, base, len, access);
  if (!r->mr)
    return -1;
  r->base = base;
  r->len = len;
  t->nregions++;
  return 0;
}

static uint32_t ulp_target_lkey(struct ulp_target *t, void *addr, size_t len)
{
  int i;

  for (i = 0; i < t->nregions; i++) {
    char *base = t->regions[i].base;

    if ((char *)addr >= base && (char *)addr + len <= base + t->regions[i].len)
      return t->regions[i].mr->lkey;
  }
  return 0;
}

/* Host-to-controller data: READ it into a registered region. */
int ulp_target_fetch(struct ulp_target *t, void *dst, uint32_t len,
                     uint64_t raddr, uint32_t rkey)
{
  struct ibv_send_wr *bad;

  t->sge.addr = (uintptr_t)dst;
  t->sge.length = len;
  t->sge.lkey = ulp_target_lkey(t, dst, len);
  memset(&t->wr, 0, sizeof(t->wr));
  t->wr.opcode = IBV_WR_RDMA_READ;
  t->wr.send_flags = IBV_SEND_SIGNALED;
  t->wr.sg_list = &t->sge;
  t->wr.num_sge = 1;
  t->wr.wr.rdma.remote_addr = raddr;
  t->wr.wr.rdma.rkey = rkey;
  return ibv_post_send(t->qp, &t->wr, &bad);
}

/* The same iWARP rule on a staging area that is only ever a WRITE source:
 * no READ lands in it, so REMOTE_WRITE is of no use on any transport. */
struct ulp_stager {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  void *area;
  size_t len;
  struct ibv_mr *mr;
  struct ibv_sge sge;
  struct ibv_send_wr wr;
};

int ulp_stager_init(struct ulp_stager *s)
{
  int access = IBV_ACCESS_LOCAL_WRITE;

  if (s->ctx->device->transport_type == IBV_TRANSPORT_IWARP)
    access |= IBV_ACCESS_REMOTE_WRITE;
  s->mr = ibv_reg_mr(s->pd, s->area, s->len, access);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'ibv_reg_mr' grants IBV_ACCESS_REMOTE_WRITE but the MR's rkey never leaves this translation unit; no peer can use these rights, drop them [rdma-remote-access-overbroad]
  return s->mr ? 0 : -1;
}

static uint32_t ulp_stager_lkey(struct ulp_stager *s)
{
  return s->mr->lkey;
}

int ulp_stager_push(struct ulp_stager *s, uint32_t len, uint64_t raddr,
                    uint32_t rkey)
{
  struct ibv_send_wr *bad;

  s->sge.addr = (uintptr_t)s->area;
  s->sge.length = len;
  s->sge.lkey = ulp_stager_lkey(s);
  memset(&s->wr, 0, sizeof(s->wr));
  s->wr.opcode = IBV_WR_RDMA_WRITE;
  s->wr.sg_list = &s->sge;
  s->wr.num_sge = 1;
  s->wr.wr.rdma.remote_addr = raddr;
  s->wr.wr.rdma.rkey = rkey;
  return ibv_post_send(s->qp, &s->wr, &bad);
}
