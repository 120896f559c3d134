#include "header.pipe"
#include <infiniband/verbs.h>

struct ibv_mr *second_register(struct ibv_pd *pd, void *buf, unsigned long len)
{
  return ibv_reg_mr(pd, buf, len, IBV_ACCESS_REMOTE_WRITE);
}
