// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// Userspace registrations and windows that are not released on some path.

#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <stdint.h>
#include <stdlib.h>
#include <errno.h>

struct ulp_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_mr *data_mr;
  struct ibv_mw *mw;
};

struct ulp_req {
  struct ibv_mr *mr;
  void *buf;
  size_t len;
};

int ulp_send_buf(struct ulp_conn *c, void *buf, size_t len);

/* A scratch registration leaked when the send fails. */
int ulp_send_once(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);

  if (!mr)
    return -1;
  if (ulp_send_buf(c, buf, len))
    return -1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'ibv_reg_mr'; it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :[[@LINE-7]]:23: note: memory region obtained here
  // CHECK-MESSAGES: :[[@LINE-4]]:3: note: error path taken here
  ibv_dereg_mr(mr);
  return 0;
}

/* Registering again over a live registration. */
int ulp_reregister(struct ulp_conn *c, void *buf, size_t len)
{
  c->data_mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!c->data_mr)
    return -1;
  if (len > 4096)
    c->data_mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: the memory region from 'ibv_reg_mr' is overwritten while still held; it leaks
  // CHECK-MESSAGES: :[[@LINE-6]]:16: note: memory region obtained here
  return c->data_mr ? 0 : -1;
}

void ulp_conn_destroy(struct ulp_conn *c)
{
  ibv_dereg_mr(c->data_mr);
}

/* The request freed with its registration. */
void ulp_req_abort(struct ulp_conn *c, struct ulp_req *req)
{
  req->mr = ibv_reg_mr(c->pd, req->buf, req->len, IBV_ACCESS_LOCAL_WRITE);
  if (!req->mr)
    return;
  free(req);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' frees the struct that still holds a memory region from 'ibv_reg_mr'; it leaks
  // CHECK-MESSAGES: :[[@LINE-5]]:13: note: memory region obtained here
}

/* Near misses: unwinding labels, a returned handle, a handle kept. */
int ok_unwind(struct ulp_conn *c, void *a, void *b, size_t len)
{
  struct ibv_mr *ma, *mb;
  int ret = -1;

  ma = ibv_reg_mr(c->pd, a, len, IBV_ACCESS_LOCAL_WRITE);
  if (!ma)
    goto out;
  mb = ibv_reg_mr(c->pd, b, len, IBV_ACCESS_LOCAL_WRITE);
  if (!mb)
    goto out_dereg_a;
  ret = ulp_send_buf(c, a, len);
  ibv_dereg_mr(mb);
out_dereg_a:
  ibv_dereg_mr(ma);
out:
  return ret;
}

struct ibv_mr *ok_returned(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  return mr;
}

/* A global handle outlives the function: the success return keeps it for
   the program, and the teardown releases it. */
static struct ibv_mr *g_ring_mr;
static char g_ring[1 << 16];

int ok_global_ring(struct ibv_pd *pd)
{
  g_ring_mr = ibv_reg_mr(pd, g_ring, sizeof(g_ring), IBV_ACCESS_LOCAL_WRITE);
  if (!g_ring_mr)
    return -1;
  return 0;
}

void ok_global_ring_teardown(void)
{
  ibv_dereg_mr(g_ring_mr);
  g_ring_mr = NULL;
}

/* Arrays of windows unwound in a loop (issue 12): every window allocated
   so far is released, both when an allocation fails and when a later step
   does, whether the loop counts down or up. */
struct ulp_slot {
  struct ibv_mw *mw;
  uint32_t rkey;
};

struct ulp_table {
  struct ibv_pd *pd;
  struct ulp_slot s[16];
  unsigned int n;
};

int ulp_table_arm(struct ulp_table *t);

int ok_table_down(struct ulp_table *t)
{
  unsigned int n;

  for (n = 0; n < 16; n++)
    if (!(t->s[n].mw = ibv_alloc_mw(t->pd, IBV_MW_TYPE_2)))
      goto undo;
  if (ulp_table_arm(t)) {
    n = 16;
    goto undo;
  }
  return 0;
undo:
  while (n--)
    ibv_dealloc_mw(t->s[n].mw);
  return -1;
}

int ok_table_up(struct ulp_table *t)
{
  unsigned int n, i;

  for (n = 0; n < 16; n++)
    if (!(t->s[n].mw = ibv_alloc_mw(t->pd, IBV_MW_TYPE_2)))
      goto undo;
  return 0;
undo:
  for (i = 0; i < n; i++)
    ibv_dealloc_mw(t->s[i].mw);
  return -1;
}

/* The unwinding starts one slot too low: the window of slot n, allocated,
   is left when the second step of its iteration fails. */
int ulp_table_mark(struct ulp_slot *s);

int ulp_table_skips_current(struct ulp_table *t)
{
  int n;

  for (n = 0; n < 16; n++) {
    t->s[n].mw = ibv_alloc_mw(t->pd, IBV_MW_TYPE_2);
    if (!t->s[n].mw)
      goto undo;
    if (ulp_table_mark(&t->s[n]))
      goto undo;
  }
  return 0;
undo:
  while (--n >= 0)
    ibv_dealloc_mw(t->s[n].mw);
  return -1;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory window from 'ibv_alloc_mw' (held in ulp_slot.mw); it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :[[@LINE-12]]:18: note: memory window obtained here
  // CHECK-MESSAGES: :[[@LINE-10]]:5: note: error path taken here
}

/* Helpers both ways: a helper that registers and returns a fresh MR, and
   one that deregisters the MR its caller passes. */
static struct ibv_mr *ulp_reg(struct ulp_conn *c, void *buf, size_t len)
{
  return ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
}

static void ulp_unreg(struct ibv_mr *mr)
{
  if (mr)
    ibv_dereg_mr(mr);
}

int ulp_bounce(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ulp_reg(c, buf, len);

  if (!mr)
    return -1;
  if (ulp_send_buf(c, buf, len))
    return -1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'ulp_reg'; it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :[[@LINE-7]]:23: note: memory region obtained here
  // CHECK-MESSAGES: :[[@LINE-4]]:3: note: error path taken here
  ulp_unreg(mr);
  return 0;
}

int ok_bounce(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ulp_reg(c, buf, len);
  int ret;

  if (!mr)
    return -1;
  ret = ulp_send_buf(c, buf, len);
  ulp_unreg(mr);
  return ret;
}

/* A cache helper returns a registration it also keeps: the caller does
   not own it. */
struct ulp_cache {
  struct ibv_pd *pd;
  struct ibv_mr *mr;
  void *buf;
};

static struct ibv_mr *ulp_cache_get(struct ulp_cache *k, size_t len)
{
  if (!k->mr)
    k->mr = ibv_reg_mr(k->pd, k->buf, len, IBV_ACCESS_LOCAL_WRITE);
  return k->mr;
}

int ok_cached(struct ulp_conn *c, struct ulp_cache *k, size_t len)
{
  struct ibv_mr *mr = ulp_cache_get(k, len);

  if (!mr)
    return -1;
  if (ulp_send_buf(c, k->buf, len))
    return -1;
  return 0;
}

/* A request just allocated holds no MR: its error path frees it safely. */
struct ulp_req *ok_req_new(struct ulp_conn *c, size_t len)
{
  struct ulp_req *req = calloc(1, sizeof(*req));

  if (!req)
    return NULL;
  req->buf = malloc(len);
  if (!req->buf)
    goto err;
  req->mr = ibv_reg_mr(c->pd, req->buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!req->mr)
    goto err;
  return req;
err:
  free(req->buf);
  free(req);
  return NULL;
}

/* A window that nothing ever deallocates, while ulp_conn_close() releases
   the MR next to it. Conditional on the program (no other unit releases
   it), so it comes last. */
int ulp_window(struct ulp_conn *c)
{
  c->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: the memory window from 'ibv_alloc_mw' is stored in 'ulp_conn.mw' but nothing releases it, while the handles next to it are released; it leaks
  return c->mw ? 0 : -1;
}

/* mlx5dv indirect mkeys: created, NULL-checked, destroyed on error paths. */
struct umr_ctx {
  struct ibv_pd *pd;
  struct mlx5dv_mkey *mkey;
};

int umr_configure(struct umr_ctx *c);

int umr_setup(struct umr_ctx *c)
{
  struct mlx5dv_mkey_init_attr attr = {
      .pd = c->pd,
      .create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
      .max_entries = 4,
  };
  struct mlx5dv_mkey *mkey = mlx5dv_create_mkey(&attr);

  if (!mkey)
    return -errno;
  if (umr_configure(c))
    return -EIO;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'mlx5dv_create_mkey'; it leaks [rdma-mr-leak]
  c->mkey = mkey;
  return 0;
}

/* Near miss: the error path destroys the mkey. */
int ok_umr_setup(struct umr_ctx *c)
{
  struct mlx5dv_mkey_init_attr attr = {
      .pd = c->pd,
      .create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
      .max_entries = 4,
  };
  struct mlx5dv_mkey *mkey = mlx5dv_create_mkey(&attr);

  if (!mkey)
    return -errno;
  if (umr_configure(c)) {
    mlx5dv_destroy_mkey(mkey);
    return -EIO;
  }
  c->mkey = mkey;
  return 0;
}

/* Near miss (QEMU migration style): the chunk MRs are deregistered in a
 * loop whose condition also tests the array, which is freed afterwards; a
 * NULL array holds no MR. */
struct demo_ram_block {
  struct ibv_mr **pmr;
  int nb_chunks;
};

void demo_ram_cleanup(struct demo_ram_block *blocks, int nb_blocks)
{
  int i, j;

  for (i = 0; i < nb_blocks; i++) {
    struct demo_ram_block *b = &blocks[i];

    for (j = 0; b->pmr && j < b->nb_chunks; j++)
      if (b->pmr[j])
        ibv_dereg_mr(b->pmr[j]);
    free(b->pmr);
    b->pmr = NULL;
  }
}

int demo_ram_register(struct ibv_pd *pd, struct demo_ram_block *b, char *base, size_t chunk)
{
  int j;

  b->pmr = calloc(b->nb_chunks, sizeof(*b->pmr));
  if (!b->pmr)
    return -1;
  for (j = 0; j < b->nb_chunks; j++) {
    b->pmr[j] = ibv_reg_mr(pd, base + j * chunk, chunk, IBV_ACCESS_LOCAL_WRITE);
    if (!b->pmr[j])
      goto unwind;
  }
  return 0;
unwind:
  while (--j >= 0)
    ibv_dereg_mr(b->pmr[j]);
  free(b->pmr);
  b->pmr = NULL;
  return -1;
}

/* perftest style: SUCCESS is 0 and FAILURE is 1, and the error labels
   unwind what was set up before the failure. */
#define DEMO_SUCCESS 0
#define DEMO_FAILURE 1

struct demo_ctx {
  struct ibv_context *context;
  struct ibv_pd *pd;
  struct ibv_cq *send_cq, *recv_cq;
  struct ibv_mr *ctrl_mr;
  char *ctrl_buf;
};

int demo_ctx_init(struct demo_ctx *ctx) {
  ctx->ctrl_buf = calloc(1, 4096);
  if (!ctx->ctrl_buf)
    return DEMO_FAILURE;
  ctx->ctrl_mr = ibv_reg_mr(ctx->pd, ctx->ctrl_buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  if (!ctx->ctrl_mr)
    goto buf_err;
  ctx->send_cq = ibv_create_cq(ctx->context, 64, NULL, NULL, 0);
  if (!ctx->send_cq)
    goto buf_err;
  ctx->recv_cq = ibv_create_cq(ctx->context, 64, NULL, NULL, 0);
  if (!ctx->recv_cq)
    goto scq_err;
  return DEMO_SUCCESS;

scq_err:
  ibv_destroy_cq(ctx->send_cq);
buf_err:
  free(ctx->ctrl_buf);
  return DEMO_FAILURE;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory region from 'ibv_reg_mr'
}

/* Near-miss: the same unwinding with the registration released. */
int demo_ctx_init_ok(struct demo_ctx *ctx) {
  ctx->ctrl_buf = calloc(1, 4096);
  if (!ctx->ctrl_buf)
    return DEMO_FAILURE;
  ctx->ctrl_mr = ibv_reg_mr(ctx->pd, ctx->ctrl_buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  if (!ctx->ctrl_mr)
    goto buf_err;
  ctx->send_cq = ibv_create_cq(ctx->context, 64, NULL, NULL, 0);
  if (!ctx->send_cq)
    goto mr_err;
  return DEMO_SUCCESS;

mr_err:
  ibv_dereg_mr(ctx->ctrl_mr);
buf_err:
  free(ctx->ctrl_buf);
  return DEMO_FAILURE;
}

/* Settings the function tests twice and never changes: the unwinding
   releases what the setup created under the same test. */
struct demo_params {
  int use_mw;
  int verb;
};

struct demo_res {
  struct ibv_pd *pd;
  struct ibv_mw *mw;
  struct ibv_mr *mr;
  struct ibv_cq *cq;
  struct ibv_context *context;
};

/* Near-miss: the window exists exactly when use_mw is set. */
int demo_res_init(struct demo_res *r, struct demo_params *p, char *buf) {
  r->mr = ibv_reg_mr(r->pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  if (!r->mr)
    return DEMO_FAILURE;
  if (p->use_mw) {
    r->mw = ibv_alloc_mw(r->pd, IBV_MW_TYPE_2);
    if (!r->mw)
      goto mr_err;
  }
  if (p->verb == 2) {
    r->cq = ibv_create_cq(r->context, 64, NULL, NULL, 0);
    if (!r->cq)
      goto mw_err;
  }
  return DEMO_SUCCESS;

mw_err:
  if (p->use_mw)
    ibv_dealloc_mw(r->mw);
mr_err:
  ibv_dereg_mr(r->mr);
  return DEMO_FAILURE;
}

/* Positive: the unwinding tests another setting than the one that
   created the window. */
int demo_res_init_bad(struct demo_res *r, struct demo_params *p, char *buf) {
  r->mr = ibv_reg_mr(r->pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  if (!r->mr)
    return DEMO_FAILURE;
  if (p->use_mw) {
    r->mw = ibv_alloc_mw(r->pd, IBV_MW_TYPE_2);
    if (!r->mw)
      goto mr_err;
  }
  if (p->verb == 2) {
    r->cq = ibv_create_cq(r->context, 64, NULL, NULL, 0);
    if (!r->cq)
      goto mw_err;
  }
  return DEMO_SUCCESS;

mw_err:
  if (p->verb == 3)
    ibv_dealloc_mw(r->mw);
mr_err:
  ibv_dereg_mr(r->mr);
  return DEMO_FAILURE;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory window from 'ibv_alloc_mw'
}

// UCX-style memory handles: an anonymous struct named by its typedef is a
// struct like any other. A handle given to the caller through an out
// parameter is the caller's; one whose struct is freed on a later error
// leaks.
typedef struct {
  struct ibv_mr *mr;
  void *address;
  size_t length;
} md_memh_t;

int md_mem_reg(struct ibv_pd *pd, void *address, size_t length, md_memh_t **memh_p)
{
  md_memh_t *memh = malloc(sizeof(*memh));

  if (!memh)
    return -ENOMEM;
  memh->mr = ibv_reg_mr(pd, address, length, IBV_ACCESS_LOCAL_WRITE);
  if (!memh->mr) {
    free(memh);
    return -EIO;
  }
  memh->address = address;
  memh->length = length;
  *memh_p = memh;
  return 0;
}

int md_check_alignment(void *address);

int md_mem_reg_aligned(struct ibv_pd *pd, void *address, size_t length, md_memh_t **memh_p)
{
  md_memh_t *memh = malloc(sizeof(*memh));

  if (!memh)
    return -ENOMEM;
  memh->mr = ibv_reg_mr(pd, address, length, IBV_ACCESS_LOCAL_WRITE);
  if (!memh->mr) {
    free(memh);
    return -EIO;
  }
  if (md_check_alignment(address)) {
    free(memh);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'free' frees the struct that still holds a memory region from 'ibv_reg_mr'; it leaks [rdma-mr-leak]
    // CHECK-MESSAGES: :[[@LINE-8]]:14: note: memory region obtained here
    return -EINVAL;
  }
  *memh_p = memh;
  return 0;
}

/* A broker lends windows from a pool to subscribers: taken by popping,
 * given back by pushing. A push writes the free element past the ones
 * in use, not the element a pop found. */
struct brk_sub {
  struct ibv_mw *mw;
  uint32_t rkey;
  int durable;
};

struct brk {
  struct ibv_pd *pd;
  struct ibv_mw *mw_pool[32];
  int mw_nfree;
};

int brk_bind(struct brk *b, struct ibv_mw *mw);

int brk_init(struct brk *b)
{
  int i;

  for (i = 0; i < 32; i++) {
    b->mw_pool[i] = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
    if (!b->mw_pool[i])
      break;
  }
  b->mw_nfree = i;
  return i ? 0 : -ENOMEM;
}

int brk_attach(struct brk *b, struct brk_sub *s)
{
  struct ibv_mw *mw;

  if (!b->mw_nfree)
    return -EBUSY;
  mw = b->mw_pool[--b->mw_nfree];
  if (brk_bind(b, mw)) {
    b->mw_pool[b->mw_nfree++] = mw; /* back on the pool */
    return -EIO;
  }
  s->mw = mw;
  s->rkey = mw->rkey;
  return 0;
}

void brk_detach(struct brk *b, struct brk_sub *s)
{
  if (!s->mw)
    return;
  if (!s->durable && b->mw_nfree < 32) {
    b->mw_pool[b->mw_nfree++] = s->mw;
    s->mw = NULL;
    return;
  }
  ibv_dealloc_mw(s->mw);
  s->mw = NULL;
}

/* Emptying the pool by dropping its windows leaks each one found there. */
void brk_pool_forget(struct brk *b)
{
  for (int i = 0; i < 32; i++) {
    if (!b->mw_pool[i])
      continue;
    b->mw_pool[i] = NULL;
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: {{.*}}mw_pool[]{{.*}} [rdma-mr-leak]
  }
  b->mw_nfree = 0;
}
