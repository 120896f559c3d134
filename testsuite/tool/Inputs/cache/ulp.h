/* Shared by a.c and b.c. */
#include <infiniband/verbs.h>

struct ulp_ctx {
  struct ibv_pd *pd;
  struct ibv_mr *mr;
  void *buf;
  unsigned long len;
};
