/* Log shipping to a replica: conn.c sets the connection up, ship.c ships. */
#ifndef REPL_H
#define REPL_H
#include <infiniband/verbs.h>
#include <stdint.h>

struct repl_ack_msg {
  uint64_t addr;
  uint32_t rkey;
};

struct repl_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  char *log;
  size_t log_len;
  struct ibv_mr *log_mr;
  uint64_t *ack_page;
  struct ibv_mr *ack_mr;
  struct repl_ack_msg *hello;
  struct ibv_mr *hello_mr;
  uint64_t remote_log;
  uint32_t remote_log_rkey;
};

int repl_conn_setup(struct repl_conn *c);
int repl_ship(struct repl_conn *c, uint64_t off, uint32_t len);
#endif
