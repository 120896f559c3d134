#include "repl.h"
#include <errno.h>

int repl_conn_setup(struct repl_conn *c)
{
  c->log_mr = ibv_reg_mr(c->pd, c->log, c->log_len, 0);
  if (!c->log_mr)
    return -errno;
  /* "so replicas can write acknowledgements into it" */
  c->ack_mr = ibv_reg_mr(c->pd, c->ack_page, 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!c->ack_mr)
    return -errno;
  return 0;
}
