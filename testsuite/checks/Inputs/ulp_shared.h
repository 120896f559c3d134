/* A ULP header shared by several source files. */
#ifndef ULP_SHARED_H
#define ULP_SHARED_H
#include <infiniband/verbs.h>

struct ulp_shared_conn {
  struct ibv_pd *pd;
  struct ibv_mr *exported_mr; /* its rkey is sent by another file */
  void *buf;
  size_t len;
};
#endif
