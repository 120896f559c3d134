#include "other.h"

struct ibv_mr *ulp_register_local(struct ibv_pd *pd, void *buf, unsigned long len)
{
  return ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
}
