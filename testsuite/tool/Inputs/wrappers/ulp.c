/* A ULP that goes through its own verbs wrappers (defined in another
 * library), as many do for logging and accounting. */
#include <infiniband/verbs.h>
#include <stddef.h>

struct ibv_mr *ulp_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
int ulp_dereg_mr(struct ibv_mr *mr);

struct ulp_buf {
  struct ibv_pd *pd;
  void *data;
  size_t len;
  struct ibv_mr *mr;
};

/* The peer writes into this buffer: REMOTE_WRITE without LOCAL_WRITE. */
int ulp_expose_for_write(struct ulp_buf *b)
{
  b->mr = ulp_reg_mr(b->pd, b->data, b->len, IBV_ACCESS_REMOTE_WRITE);
  return b->mr ? 0 : -1;
}
