#include "ulp.h"

struct ibv_mr *ulp_register(struct ibv_pd *pd, void *buf, size_t len)
{
  return ibv_reg_mr(pd, buf, round_up(len, 64), IBV_ACCESS_REMOTE_WRITE);
}
