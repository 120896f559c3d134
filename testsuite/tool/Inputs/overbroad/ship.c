#include "repl.h"

/* WRITE the records into the replica's log; acknowledgements come back as
 * SENDs. */
int repl_ship(struct repl_conn *c, uint64_t off, uint32_t len)
{
  struct ibv_sge sge = {.addr = (uintptr_t)(c->log + off), .length = len,
                        .lkey = c->log_mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr *bad;

  wr.wr.rdma.remote_addr = c->remote_log + off;
  wr.wr.rdma.rkey = c->remote_log_rkey;
  return ibv_post_send(c->qp, &wr, &bad);
}
