#include "ulp.h"

void ulp_send_key(unsigned int rkey);

int ulp_register(struct ulp_ctx *c)
{
  c->mr = ibv_reg_mr(c->pd, c->buf, c->len, IBV_ACCESS_REMOTE_WRITE);
  if (!c->mr)
    return -1;
  ulp_send_key(c->mr->rkey);
  return 0;
}
