#include "ulp.h"

int ulp_unregister(struct ulp_ctx *c)
{
  return c->mr ? ibv_dereg_mr(c->mr) : 0;
}
