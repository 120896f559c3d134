// RUN: %check_ulplint %s rdma-access-flags-invalid %t
// RUN: %check_ulplint --mode=plugin %s rdma-access-flags-invalid %t.plugin

// Userspace registrations and memory-window binds against the real
// rdma-core headers.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

#define ULP_REMOTE_FLAGS (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
enum { ULP_ATOMIC_ACCESS = IBV_ACCESS_REMOTE_ATOMIC };

struct ulp_buf {
  void *addr;
  size_t len;
  struct ibv_mr *mr;
};

struct ulp_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_qp_ex *qpx;
  struct ulp_buf recv;
  struct ulp_buf data;
  struct ibv_mw *mw;
  struct ibv_mr *window_mr;
  int writable;
  int dmabuf_fd;
};

/* Flags built over several statements: wrong on the writable path only. */
int ulp_reg_data(struct ulp_conn *c)
{
  int access = IBV_ACCESS_REMOTE_READ;

  if (c->writable)
    access |= IBV_ACCESS_REMOTE_WRITE;
  c->data.mr = ibv_reg_mr(c->pd, c->data.addr, c->data.len, access);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'ibv_reg_mr' requests IBV_ACCESS_REMOTE_WRITE without IBV_ACCESS_LOCAL_WRITE; the registration fails with EINVAL on some paths [rdma-access-flags-invalid]
  // CHECK-MESSAGES: :[[@LINE-3]]:5: note: access flags computed here
  // CHECK-FIXES: c->data.mr = ibv_reg_mr(c->pd, c->data.addr, c->data.len, IBV_ACCESS_LOCAL_WRITE | access);
  return c->data.mr ? 0 : -1;
}

/* A macro from the ULP's own header. */
int ulp_reg_recv(struct ulp_conn *c)
{
  c->recv.mr = ibv_reg_mr(c->pd, c->recv.addr, c->recv.len, ULP_REMOTE_FLAGS);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'ibv_reg_mr' requests IBV_ACCESS_REMOTE_WRITE without IBV_ACCESS_LOCAL_WRITE; the registration fails with EINVAL [rdma-access-flags-invalid]
  // CHECK-FIXES: c->recv.mr = ibv_reg_mr(c->pd, c->recv.addr, c->recv.len, IBV_ACCESS_LOCAL_WRITE | ULP_REMOTE_FLAGS);
  if (!c->recv.mr)
    return -1;
  return 0;
}

/* A ternary needs parentheses once LOCAL_WRITE is added. */
struct ibv_mr *ulp_reg_iova(struct ulp_conn *c, uint64_t iova)
{
  return ibv_reg_mr_iova(c->pd, c->data.addr, c->data.len, iova,
                         c->writable ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ);
  // CHECK-MESSAGES: :[[@LINE-2]]:10: warning: 'ibv_reg_mr_iova' requests IBV_ACCESS_REMOTE_WRITE without IBV_ACCESS_LOCAL_WRITE; the registration fails with EINVAL on some paths [rdma-access-flags-invalid]
  // CHECK-FIXES: IBV_ACCESS_LOCAL_WRITE | (c->writable ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ));
}

/* An enum constant of the ULP, through a dma-buf registration. */
struct ibv_mr *ulp_reg_dmabuf(struct ulp_conn *c, uint64_t offset)
{
  return ibv_reg_dmabuf_mr(c->pd, offset, c->data.len, 0, c->dmabuf_fd,
                           ULP_ATOMIC_ACCESS | IBV_ACCESS_REMOTE_READ);
  // CHECK-MESSAGES: :[[@LINE-2]]:10: warning: 'ibv_reg_dmabuf_mr' requests IBV_ACCESS_REMOTE_ATOMIC without IBV_ACCESS_LOCAL_WRITE; the registration fails with EINVAL [rdma-access-flags-invalid]
  // CHECK-FIXES: IBV_ACCESS_LOCAL_WRITE | ULP_ATOMIC_ACCESS | IBV_ACCESS_REMOTE_READ);
}

/* A type-2 window bound over an MR registered for binding only (below). */
void ulp_expose(struct ulp_conn *c, int rdonly)
{
  struct ibv_mw_bind_info info = {
    .mr = c->window_mr,
    .addr = (uintptr_t)c->data.addr,
    .length = c->data.len,
    .mw_access_flags = rdonly ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE,
    // CHECK-MESSAGES: :[[@LINE-1]]:24: warning: memory window bound to an MR registered without IBV_ACCESS_LOCAL_WRITE; a window granting remote write or atomic access needs local write access on its MR, so the bind fails [rdma-access-flags-invalid]
  };

  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, c->mw, ibv_inc_rkey(c->mw->rkey), &info);
  ibv_wr_complete(c->qpx);
}

int ulp_setup_window(struct ulp_conn *c)
{
  c->window_mr = ibv_reg_mr(c->pd, c->data.addr, c->data.len, IBV_ACCESS_MW_BIND);
  // CHECK-MESSAGES: :[[@LINE-1]]:18: note: MR registered here
  // CHECK-FIXES: c->window_mr = ibv_reg_mr(c->pd, c->data.addr, c->data.len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  c->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
  return c->window_mr && c->mw ? 0 : -1;
}

/* A bind through a work request, over an MR registered (below) without
 * MW_BIND. */
static struct ibv_mr *ulp_reg_bindable(struct ulp_conn *c);

int ulp_bind_through_wr(struct ulp_conn *c)
{
  struct ibv_send_wr wr, *bad;
  struct ibv_mr *mr = ulp_reg_bindable(c);

  wr.opcode = IBV_WR_BIND_MW;
  wr.next = NULL;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = c->mw;
  wr.bind_mw.rkey = ibv_inc_rkey(c->mw->rkey);
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: memory window bound to an MR registered without IBV_ACCESS_MW_BIND; windows can only be bound to MRs registered for binding, so the bind fails [rdma-access-flags-invalid]
  return ibv_post_send(c->qp, &wr, &bad);
}

static struct ibv_mr *ulp_reg_bindable(struct ulp_conn *c)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, c->recv.addr, c->recv.len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  // CHECK-MESSAGES: :[[@LINE-2]]:23: note: MR registered here
  // CHECK-FIXES: IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  return mr;
}

/* Near misses: nothing below is reported. */

/* Remote read alone needs no local write. */
struct ibv_mr *ok_read_only(struct ulp_conn *c)
{
  return ibv_reg_mr(c->pd, c->data.addr, c->data.len, IBV_ACCESS_REMOTE_READ);
}

/* Local write added on every path before the call. */
struct ibv_mr *ok_fixed_later(struct ulp_conn *c)
{
  unsigned int access = IBV_ACCESS_REMOTE_WRITE;

  if (c->writable)
    access |= IBV_ACCESS_REMOTE_ATOMIC;
  access |= IBV_ACCESS_LOCAL_WRITE;
  return ibv_reg_mr(c->pd, c->data.addr, c->data.len, access);
}

/* Flags from the caller: unknown here, so not judged. */
struct ibv_mr *ok_caller_flags(struct ulp_conn *c, int access)
{
  return ibv_reg_mr(c->pd, c->data.addr, c->data.len,
                    (access & ~IBV_ACCESS_LOCAL_WRITE) | IBV_ACCESS_REMOTE_READ);
}

/* Both branches carry local write. */
struct ibv_mr *ok_ternary(struct ulp_conn *c)
{
  return ibv_reg_mr(c->pd, c->data.addr, c->data.len,
                    IBV_ACCESS_LOCAL_WRITE |
                        (c->writable ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ));
}

/* A bind over an MR registered with LOCAL_WRITE | MW_BIND. */
void ok_bind(struct ulp_conn *c, struct ibv_mr *mr)
{
  struct ibv_mr *bindable = ibv_reg_mr(c->pd, c->data.addr, c->data.len,
                                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  struct ibv_mw_bind_info info = {
      .mr = bindable, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};

  ibv_wr_bind_mw(c->qpx, c->mw, ibv_inc_rkey(c->mw->rkey), &info);
  (void)mr;
}

/* Suppressed with NOLINT. */
struct ibv_mr *suppressed(struct ulp_conn *c)
{
  return ibv_reg_mr(c->pd, c->data.addr, c->data.len, IBV_ACCESS_REMOTE_WRITE); // NOLINT(rdma-access-flags-invalid)
}
