#include <infiniband/verbs.h>

struct ulp_ctx {
  struct ibv_pd *pd;
  struct ibv_mr *mr;
  void *buf;
  unsigned long len;
};

void ulp_send_key(unsigned int rkey);

int ulp_register(struct ulp_ctx *c)
{
  c->mr = ibv_reg_mr(c->pd, c->buf, c->len, IBV_ACCESS_REMOTE_WRITE);
  if (!c->mr)
    return -1;
  ulp_send_key(c->mr->rkey);
  return 0;
}

int ulp_register_quiet(struct ulp_ctx *c)
{
  // NOLINTNEXTLINE(rdma-access-flags-invalid)
  c->mr = ibv_reg_mr(c->pd, c->buf, c->len, IBV_ACCESS_REMOTE_ATOMIC);
  return c->mr ? 0 : -1;
}

void ulp_unregister(struct ulp_ctx *c)
{
  if (c->mr)
    ibv_dereg_mr(c->mr);
  c->mr = 0;
}

struct ulp_bounce {
  struct ibv_mr *mr;
  char buf[4096];
};

int ulp_bounce_init(struct ulp_bounce *b, struct ibv_pd *pd)
{
  b->mr = ibv_reg_mr(pd, b->buf, sizeof(b->buf),
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  return b->mr ? 0 : -1;
}

void ulp_bounce_fini(struct ulp_bounce *b)
{
  ibv_dereg_mr(b->mr);
}
