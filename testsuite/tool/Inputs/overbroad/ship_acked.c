#include "repl.h"
#include <endian.h>

/* The first shipment tells the replica where to WRITE its
 * acknowledgements: the ack page's key leaves in the hello message. */
int repl_ship(struct repl_conn *c, uint64_t off, uint32_t len)
{
  struct ibv_sge sge = {.addr = (uintptr_t)c->hello,
                        .length = sizeof(*c->hello),
                        .lkey = c->hello_mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr *bad;

  (void)off;
  (void)len;
  c->hello->addr = htobe64((uintptr_t)c->ack_page);
  c->hello->rkey = htobe32(c->ack_mr->rkey);
  return ibv_post_send(c->qp, &wr, &bad);
}
