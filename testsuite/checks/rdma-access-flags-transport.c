// RUN: %check_ulplint %s rdma-access-flags-transport %t
// RUN: %check_ulplint --mode=plugin %s rdma-access-flags-transport %t.plugin
// RUN: %check_ulplint --check-suffixes=NOIWARP %s rdma-access-flags-transport %t.noiwarp -- \
// RUN:   --config="{CheckOptions: {rdma-access-flags-transport.AssumeIWarp: false}}"

// Userspace: transport tests that pick access flags, and RDMA READ sinks
// registered without REMOTE_WRITE.

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdbool.h>
#include <stdint.h>

/* From regcore.h: the transport-independent helper. */
unsigned int regcore_access_flags(void *core, int role);

struct ulp_buf {
  void *addr;
  size_t len;
  struct ibv_mr *mr;
};

struct ulp_conn {
  struct rdma_cm_id *id;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_qp_ex *qpx;
  struct ulp_buf sink;
  struct ulp_buf bounce;
  struct ulp_buf msg;
  void *core;
};

struct ulp_read_req {
  struct ibv_send_wr wr;
  struct ibv_sge sge;
  struct ulp_conn *conn;
};

/* (a) The ULP repeats the iWARP rule with its own transport test. */
int ulp_reg_sink(struct ulp_conn *c)
{
  int access = IBV_ACCESS_LOCAL_WRITE;

  if (c->ctx->device->transport_type == IBV_TRANSPORT_IWARP)
    access |= IBV_ACCESS_REMOTE_WRITE;
  c->sink.mr = ibv_reg_mr(c->pd, c->sink.addr, c->sink.len, access);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: access flags for 'ibv_reg_mr' are chosen by an inline transport test; use regcore_access_flags(), which derives the rights from the device and the buffer's role [rdma-access-flags-transport]
  // CHECK-MESSAGES: :[[@LINE-4]]:41: note: transport tested here
  // CHECK-MESSAGES-NOIWARP: :[[@LINE-3]]:16: warning: access flags for 'ibv_reg_mr' are chosen by an inline transport test
  // CHECK-MESSAGES-NOIWARP: :[[@LINE-6]]:41: note: transport tested here
  return c->sink.mr ? 0 : -1;
}

/* (a) The same through a local boolean and a ternary. */
int ulp_reg_bounce(struct ulp_conn *c)
{
  bool iwarp = c->ctx->device->transport_type == IBV_TRANSPORT_IWARP;

  c->bounce.mr = ibv_reg_mr(c->pd, c->bounce.addr, c->bounce.len,
                            iwarp ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                                  : IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-3]]:18: warning: access flags for 'ibv_reg_mr' are chosen by an inline transport test
  // CHECK-MESSAGES: :[[@LINE-6]]:50: note: transport tested here
  // CHECK-MESSAGES-NOIWARP: :[[@LINE-5]]:18: warning: access flags for 'ibv_reg_mr' are chosen by an inline transport test
  // CHECK-MESSAGES-NOIWARP: :[[@LINE-8]]:50: note: transport tested here
  return c->bounce.mr ? 0 : -1;
}

/* (b) A buffer registered for local access only, then used (below) as the
 * sink of an RDMA READ built in a request struct. The READ is reported:
 * that is where the buffer is used for what its rights do not allow. */
int ulp_fetch(struct ulp_read_req *req, uint64_t raddr, uint32_t rkey)
{
  struct ulp_conn *c = req->conn;
  struct ibv_send_wr *bad;

  req->sge.addr = (uintptr_t)c->msg.addr;
  req->sge.length = c->msg.len;
  req->sge.lkey = c->msg.mr->lkey;
  req->wr.opcode = IBV_WR_RDMA_READ;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: RDMA READ into memory registered without IBV_ACCESS_REMOTE_WRITE; on iWARP the READ response is a tagged write into the sink, so the READ fails; use regcore_access_flags(), which derives the rights from the device and the buffer's role [rdma-access-flags-transport]
  // CHECK-MESSAGES: :[[@LINE+12]]:15: note: the sink is registered here
  req->wr.sg_list = &req->sge;
  req->wr.num_sge = 1;
  req->wr.wr.rdma.remote_addr = raddr;
  req->wr.wr.rdma.rkey = rkey;
  req->wr.send_flags = IBV_SEND_SIGNALED;
  req->wr.next = NULL;
  return ibv_post_send(c->qp, &req->wr, &bad);
}

int ulp_reg_msg(struct ulp_conn *c)
{
  c->msg.mr = ibv_reg_mr(c->pd, c->msg.addr, c->msg.len, IBV_ACCESS_LOCAL_WRITE);
  return c->msg.mr ? 0 : -1;
}

/* (b) librdmacm: rdma_reg_msgs gives local write only. */
int ulp_cm_read(struct ulp_conn *c, void *buf, size_t len, uint64_t raddr,
                uint32_t rkey)
{
  struct ibv_mr *mr = rdma_reg_msgs(c->id, buf, len);
  int ret;

  if (!mr)
    return -1;
  ret = rdma_post_read(c->id, NULL, buf, len, mr, IBV_SEND_SIGNALED, raddr, rkey);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: RDMA READ into memory registered without IBV_ACCESS_REMOTE_WRITE
  // CHECK-MESSAGES: :[[@LINE-7]]:23: note: the sink is registered here
  return ret;
}

/* (b) The extended post API. */
int ulp_wr_read(struct ulp_conn *c, struct ulp_buf *dst, uint64_t raddr,
                uint32_t rkey)
{
  dst->mr = ibv_reg_mr(c->pd, dst->addr, dst->len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!dst->mr)
    return -1;
  ibv_wr_start(c->qpx);
  c->qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_read(c->qpx, rkey, raddr);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: RDMA READ into memory registered without IBV_ACCESS_REMOTE_WRITE
  // CHECK-MESSAGES: :[[@LINE-8]]:13: note: the sink is registered here
  ibv_wr_set_sge(c->qpx, dst->mr->lkey, (uintptr_t)dst->addr, dst->len);
  return ibv_wr_complete(c->qpx);
}

/* (b) One READ builder for several buffers: the lkey is the builder's
 * parameter, so each call is a READ into what its caller passes. Only the
 * call with the LOCAL_WRITE-only scratch buffer is reported. */
struct img_srv {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  char *cache, *scratch;
  struct ibv_mr *cache_mr, *scratch_mr;
};

int img_register(struct img_srv *s, size_t cache_len, size_t scratch_len)
{
  s->cache_mr = ibv_reg_mr(s->pd, s->cache, cache_len,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!s->cache_mr)
    return -1;
  s->scratch_mr = ibv_reg_mr(s->pd, s->scratch, scratch_len, IBV_ACCESS_LOCAL_WRITE);
  if (!s->scratch_mr)
    goto err_cache;
  return 0;
err_cache:
  ibv_dereg_mr(s->cache_mr);
  return -1;
}

static int img_read(struct img_srv *s, void *dst, uint32_t lkey, uint64_t raddr,
                    uint32_t rkey, uint32_t len)
{
  struct ibv_sge sge = { (uintptr_t)dst, len, lkey };
  struct ibv_send_wr wr = {
    .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
    .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = raddr, .rkey = rkey },
  }, *bad;

  return ibv_post_send(s->qp, &wr, &bad);
}

int img_pull_layer(struct img_srv *s, uint64_t off, uint64_t raddr, uint32_t rkey,
                   uint32_t len)
{
  return img_read(s, s->cache + off, s->cache_mr->lkey, raddr, rkey, len);
}

int img_verify(struct img_srv *s, uint64_t raddr, uint32_t rkey, uint32_t len)
{
  return img_read(s, s->scratch, s->scratch_mr->lkey, raddr, rkey, len);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: RDMA READ into memory registered without IBV_ACCESS_REMOTE_WRITE
  // CHECK-MESSAGES: :[[@LINE-32]]:19: note: the sink is registered here
}

/* (b) The builder takes the opcode: a READ for one caller, a WRITE (whose
 * source needs no remote rights) for the other. */
struct mig_xfer {
  struct ibv_qp *qp;
  struct ibv_pd *pd;
  void *buf;
  size_t len;
  struct ibv_mr *mr;
  struct ibv_send_wr wr;
  struct ibv_sge sge;
};

static void mig_build(struct mig_xfer *x, enum ibv_wr_opcode op, uint64_t raddr,
                      uint32_t rkey)
{
  x->sge.addr = (uintptr_t)x->buf;
  x->sge.length = (uint32_t)x->len;
  x->sge.lkey = x->mr->lkey;
  x->wr.opcode = op;
  x->wr.sg_list = &x->sge;
  x->wr.num_sge = 1;
  x->wr.wr.rdma.remote_addr = raddr;
  x->wr.wr.rdma.rkey = rkey;
}

int mig_pull(struct mig_xfer *x, uint64_t raddr, uint32_t rkey)
{
  struct ibv_send_wr *bad;

  x->mr = ibv_reg_mr(x->pd, x->buf, x->len, IBV_ACCESS_LOCAL_WRITE);
  if (!x->mr)
    return -1;
  mig_build(x, IBV_WR_RDMA_READ, raddr, rkey);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: RDMA READ into memory registered without IBV_ACCESS_REMOTE_WRITE
  // CHECK-MESSAGES: :[[@LINE-5]]:11: note: the sink is registered here
  return ibv_post_send(x->qp, &x->wr, &bad);
}

int mig_push(struct mig_xfer *x, uint64_t raddr, uint32_t rkey)
{
  struct ibv_send_wr *bad;

  x->mr = ibv_reg_mr(x->pd, x->buf, x->len, IBV_ACCESS_LOCAL_WRITE);
  if (!x->mr)
    return -1;
  mig_build(x, IBV_WR_RDMA_WRITE, raddr, rkey);
  return ibv_post_send(x->qp, &x->wr, &bad);
}

/* Near misses. */

/* The READ sink carries REMOTE_WRITE on every transport. */
int ok_sink_with_remote_write(struct ulp_conn *c, void *buf, size_t len,
                              uint64_t raddr, uint32_t rkey)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  return rdma_post_read(c->id, NULL, buf, len, mr, 0, raddr, rkey);
}

/* Flags from the transport-independent helper. */
int ok_helper_flags(struct ulp_conn *c, void *buf, size_t len, uint64_t raddr,
                    uint32_t rkey)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len, regcore_access_flags(c->core, 1));
  return rdma_post_read(c->id, NULL, buf, len, mr, 0, raddr, rkey);
}

/* A SEND source needs no remote rights. */
int ok_send_source(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = rdma_reg_msgs(c->id, buf, len);
  return rdma_post_send(c->id, NULL, buf, len, mr, IBV_SEND_SIGNALED);
}

/* A transport test that does not choose access flags. */
int ok_transport_sizing(struct ulp_conn *c, struct ibv_qp_init_attr *attr)
{
  attr->cap.max_send_sge =
      c->ctx->device->transport_type == IBV_TRANSPORT_IWARP ? 1 : 4;
  c->msg.mr = ibv_reg_mr(c->pd, c->msg.addr, c->msg.len, IBV_ACCESS_LOCAL_WRITE);
  return 0;
}
