#include <infiniband/verbs.h>

int ulp_broken(struct ibv_pd *pd)
{
  return ibv_reg_mr(pd, 0, 0 IBV_ACCESS_LOCAL_WRITE);
}
