// RUN: %check_ulplint %s rdma-invalidation-leak %t

// A one-sided runtime: a symmetric heap whose key is handed to the
// runtime's key exchange (another file), staging copies registered for
// device memory, and rendezvous requests found again from the FIN
// message's request cookie. Memory behind a remote-access registration
// must not go back before ibv_dereg_mr() kills the key.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int rt_exchange_keys(void *peers, uintptr_t base, uint32_t rkey);

struct rt_heap {
  struct ibv_pd *pd;
  struct ibv_mr *mr;
  char *base;
  size_t len;
  void *peers;
};

static struct rt_heap heap;

int rt_heap_init(size_t len)
{
  heap.base = malloc(len);
  if (!heap.base)
    return -1;
  heap.mr = ibv_reg_mr(heap.pd, heap.base, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!heap.mr) {
    free(heap.base);
    return -1;
  }
  heap.len = len;
  return rt_exchange_keys(heap.peers, (uintptr_t)heap.base, heap.mr->rkey);
}

/* The old heap goes back to malloc while every peer holds its key. */
int rt_heap_grow(char *nbase, size_t nlen)
{
  struct ibv_mr *mr = ibv_reg_mr(heap.pd, nbase, nlen,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

  if (!mr)
    return -1;
  memcpy(nbase, heap.base, heap.len);
  free(heap.base);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  ibv_dereg_mr(heap.mr);
  heap.mr = mr;
  heap.base = nbase;
  heap.len = nlen;
  return rt_exchange_keys(heap.peers, (uintptr_t)nbase, mr->rkey);
}

/* Near miss: deregistered first, then freed. */
void rt_heap_fini(void)
{
  ibv_dereg_mr(heap.mr);
  free(heap.base);
}

struct rt_desc {
  struct ibv_mr *mr;
  void *bounce;
};

uint32_t rt_desc_key(const struct rt_desc *d)
{
  return d->mr->rkey;
}

int rt_desc_reg(struct ibv_pd *pd, void *buf, size_t len, int device_mem,
                struct rt_desc *d)
{
  void *reg_buf = buf;

  d->bounce = NULL;
  if (device_mem) {
    d->bounce = malloc(len);
    if (!d->bounce)
      return -1;
    reg_buf = d->bounce;
  }
  d->mr = ibv_reg_mr(pd, reg_buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!d->mr) {
    free(d->bounce);
    return -1;
  }
  return 0;
}

/* The staging copy the MR covers is freed before the MR. */
int rt_desc_close(struct rt_desc *d)
{
  if (d->bounce) {
    free(d->bounce);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
    d->bounce = NULL;
  }
  return ibv_dereg_mr(d->mr);
}

struct rt_req {
  struct ibv_mr *mr;
  void *pack;
  int done;
};

struct rt_fin {
  uint64_t cookie;
};

int rt_send_rts(struct ibv_qp *qp, uint32_t rkey);

int rt_rndv_start(struct ibv_pd *pd, struct ibv_qp *qp, struct rt_req *req, size_t len)
{
  req->pack = malloc(len);
  if (!req->pack)
    return -1;
  req->mr = ibv_reg_mr(pd, req->pack, len, IBV_ACCESS_REMOTE_READ);
  if (!req->mr) {
    free(req->pack);
    return -1;
  }
  return rt_send_rts(qp, req->mr->rkey);
}

/* The request comes back through the FIN's cookie: it is the same request,
 * and its packed copy is freed before its MR. */
void rt_handle_fin(const struct rt_fin *fin)
{
  struct rt_req *req = (struct rt_req *)(uintptr_t)fin->cookie;

  free(req->pack);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  ibv_dereg_mr(req->mr);
  req->done = 1;
}

/* Near miss: the same request, in the right order. */
void rt_handle_fin_ordered(const struct rt_fin *fin)
{
  struct rt_req *req = (struct rt_req *)(uintptr_t)fin->cookie;

  ibv_dereg_mr(req->mr);
  free(req->pack);
  req->done = 1;
}
