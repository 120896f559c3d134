/*
 * mpi_rndv.c - point-to-point transport of a small MPI runtime over
 * librdmacm endpoints.
 *
 * Eager messages (<= RNDV_EAGER_MAX) are copied into a send bounce slot.
 * Medium messages (<= RNDV_MEDIUM_MAX) are pulled by the receiver with an
 * RDMA READ into a pre-registered slot.  Larger ones use rendezvous: the
 * sender registers the user buffer (or a pack buffer for derived datatypes)
 * and sends RTS with its rkey; the receiver reads into the user buffer,
 * registered through its registration cache, and answers FIN.  Send-queue
 * space is accounted with credits; control messages are signaled every
 * RNDV_SIG_INTERVAL posts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define RNDV_EAGER_MAX      4096
#define RNDV_MEDIUM_MAX     (64 * 1024)
#define RNDV_NUM_SLOTS      128
#define RNDV_RX_SPACE       (RNDV_EAGER_MAX + 64)                  /* receive part of a slot */
#define RNDV_SLOT_SIZE      (RNDV_RX_SPACE + RNDV_MEDIUM_MAX)      /* + medium-get landing zone */
#define RNDV_SQ_DEPTH       2048
#define RNDV_RQ_DEPTH       512
#define RNDV_SIG_INTERVAL   16
#define RNDV_RCACHE_MAX     256

#define RNDV_UNLIKELY(x)    __builtin_expect(!!(x), 0)

enum { RNDV_MSG_EAGER = 1, RNDV_MSG_RTS, RNDV_MSG_FIN };

struct rndv_hdr {
    uint8_t  type;
    uint8_t  pad[3];
    uint32_t rkey;
    uint64_t tag;
    uint64_t addr;
    uint64_t len;
    uint64_t sreq;              /* sender request, echoed in FIN */
};

struct rndv_ctrl {
    struct rndv_hdr h;
    char            payload[RNDV_EAGER_MAX];
};

struct rndv_rcache_ent {
    struct rndv_rcache_ent *next;
    void                   *addr;
    size_t                  len;
    struct ibv_mr          *mr;
};

struct rndv_req {
    uint64_t          tag;
    void             *buf;
    size_t            len;
    void             *pack_buf;     /* derived datatypes only */
    struct ibv_mr    *mr;
    int               done;
    uint64_t          sreq;         /* receive side: peer's request */
};

struct rndv_ep {
    struct rdma_cm_id       *id;
    char                    *slots;         /* RNDV_NUM_SLOTS x RNDV_SLOT_SIZE */
    struct ibv_mr           *slot_mr;
    struct rndv_ctrl        *ctrl;          /* send bounce: header + eager payload */
    struct ibv_mr           *ctrl_mr;
    unsigned                 ctrl_next;
    unsigned                 sq_avail;
    unsigned                 unsig_cnt;
    struct rndv_rcache_ent  *rcache;
    unsigned                 rcache_cnt;
    int                      iwarp;
};

/* matching engine, datatype engine (elsewhere in the runtime) */
struct rndv_req *rndv_match_posted(struct rndv_ep *ep, uint64_t tag);
size_t rndv_dt_pack(void *dst, const void *src, size_t len, int dt);
void rndv_complete(struct rndv_req *req);
void rndv_deliver_eager(struct rndv_ep *ep, const struct rndv_hdr *h, const void *payload);

int rndv_ep_create(struct rndv_ep *ep, struct rdma_addrinfo *res)
{
    struct ibv_qp_init_attr attr;
    size_t slots_len = (size_t)RNDV_NUM_SLOTS * RNDV_SLOT_SIZE;
    size_t ctrl_len = RNDV_NUM_SLOTS * sizeof(struct rndv_ctrl);
    int i, ret;

    memset(&attr, 0, sizeof(attr));
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = RNDV_SQ_DEPTH;        // BUG: rdma-queue-cap-unchecked -- 2048 send WRs requested without looking at max_qp_wr
    attr.cap.max_recv_wr = RNDV_RQ_DEPTH;        /* OK: rdma-queue-cap-unchecked -- 512 receives fit every device */
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = 64;
    ret = rdma_create_ep(&ep->id, res, NULL, &attr);
    if (ret)
        return -errno;
    /* OK: rdma-send-queue-undersized -- every post takes an SQ credit first */
    ep->sq_avail = RNDV_SQ_DEPTH;
    ep->iwarp = ep->id->verbs->device->transport_type == IBV_TRANSPORT_IWARP;

    ep->slots = aligned_alloc(4096, slots_len);
    if (!ep->slots)
        goto err_ep;
    // BUG: rdma-local-mr-management -- the slots are also the sink of the medium-get RDMA READ
    ep->slot_mr = rdma_reg_msgs(ep->id, ep->slots, slots_len);   /* OK: rdma-registration-in-datapath -- connection setup, which only posts receives */
    if (!ep->slot_mr)
        goto err_slots;

    ep->ctrl = calloc(RNDV_NUM_SLOTS, sizeof(*ep->ctrl));
    if (!ep->ctrl)
        goto err_slot_mr;
    /* OK: rdma-local-mr-management -- send bounce buffers are only sent from; the key never leaves */
    ep->ctrl_mr = ibv_reg_mr(ep->id->pd, ep->ctrl, ctrl_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-remote-access-overbroad -- remote write on the send bounce buffers, whose rkey is never sent
    if (!ep->ctrl_mr)
        goto err_ctrl;

    for (i = 0; i < RNDV_NUM_SLOTS; i++) {
        if (rdma_post_recv(ep->id, (void *)(uintptr_t)i, ep->slots + (size_t)i * RNDV_SLOT_SIZE,
                           RNDV_RX_SPACE, ep->slot_mr))
            goto err_ctrl_mr;
    }
    return 0;

err_ctrl_mr:
    rdma_dereg_mr(ep->ctrl_mr);
err_ctrl:
    free(ep->ctrl);
err_slot_mr:
    rdma_dereg_mr(ep->slot_mr);
err_slots:
    free(ep->slots);
err_ep:
    rdma_destroy_ep(ep->id);
    return -ENOMEM;
}

static unsigned int rndv_sink_access(const struct rndv_ep *ep)
{
    /* iWARP places READ responses with the sink's STag */
    return ep->iwarp ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                     : IBV_ACCESS_LOCAL_WRITE;
}

static struct ibv_mr *rndv_rcache_get(struct rndv_ep *ep, void *addr, size_t len)
{
    struct rndv_rcache_ent *e;
    struct ibv_mr *mr;

    for (e = ep->rcache; e; e = e->next)
        if ((char *)addr >= (char *)e->addr &&
            (char *)addr + len <= (char *)e->addr + e->len)
            return e->mr;

    /* OK: rdma-registration-in-datapath -- registers only on a cache miss and keeps the registration */
    mr = ibv_reg_mr(ep->id->pd, addr, len, rndv_sink_access(ep));  // BUG: rdma-local-mr-management, rdma-access-flags-transport -- READ sink registered by hand, its rights picked by an inline iWARP test
    if (!mr)
        return NULL;
    e = malloc(sizeof(*e));
    if (RNDV_UNLIKELY(!e))
        return NULL;        // BUG: rdma-mr-leak -- the fresh registration is dropped when the cache entry cannot be allocated
    e->addr = addr;
    e->len = len;
    e->mr = mr;
    e->next = ep->rcache;
    ep->rcache = e;
    ep->rcache_cnt++;
    return mr;
}

static int rndv_post_ctrl(struct rndv_ep *ep, const struct rndv_hdr *h,
                          const void *payload, size_t plen)
{
    struct rndv_ctrl *slot;
    size_t len = sizeof(*h) + plen;
    int flags = len <= 64 ? IBV_SEND_INLINE : 0;

    if (!ep->sq_avail)
        return -EAGAIN;
    slot = &ep->ctrl[ep->ctrl_next++ % RNDV_NUM_SLOTS];
    slot->h = *h;
    if (plen)
        memcpy(slot->payload, payload, plen);
    /* OK: rdma-unsignaled-send-starvation -- the counter advances on every post */
    if (++ep->unsig_cnt >= RNDV_SIG_INTERVAL) {
        flags |= IBV_SEND_SIGNALED;
        ep->unsig_cnt = 0;
    }
    ep->sq_avail--;
    return rdma_post_send(ep->id, NULL, slot, len, ep->ctrl_mr, flags);
}

static void rndv_req_free(struct rndv_req *req)
{
    free(req->pack_buf);
    free(req);
}

int rndv_isend(struct rndv_ep *ep, void *buf, size_t len, uint64_t tag, int dt)
{
    struct rndv_hdr h = { .tag = tag, .len = len };
    struct rndv_req *req;

    if (len <= RNDV_EAGER_MAX) {
        h.type = RNDV_MSG_EAGER;
        return rndv_post_ctrl(ep, &h, buf, len);
    }

    req = calloc(1, sizeof(*req));
    if (!req)
        return -ENOMEM;
    req->buf = buf;
    req->len = len;
    req->tag = tag;
    if (dt) {
        req->pack_buf = malloc(len);
        if (!req->pack_buf) {
            free(req);
            return -ENOMEM;
        }
        rndv_dt_pack(req->pack_buf, buf, len, dt);
    }

    // BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the user buffer is registered for every rendezvous send and its rkey goes to the peer
    req->mr = rdma_reg_read(ep->id, req->pack_buf ? req->pack_buf : buf, len);
    if (!req->mr) {
        free(req->pack_buf);
        free(req);
        return -errno;
    }

    h.type = RNDV_MSG_RTS;
    h.addr = (uintptr_t)(req->pack_buf ? req->pack_buf : buf);
    h.rkey = req->mr->rkey;
    h.sreq = (uintptr_t)req;
    if (rndv_post_ctrl(ep, &h, NULL, 0)) {
        rndv_req_free(req);     // BUG: rdma-mr-leak, rdma-invalidation-leak -- request and pack buffer freed while req->mr stays registered with remote read
        return -EAGAIN;
    }
    return 0;
}

static void rndv_handle_rts(struct rndv_ep *ep, struct ibv_wc *wc, const struct rndv_hdr *h)
{
    unsigned slot = (unsigned)wc->wr_id;
    struct rndv_req *req = rndv_match_posted(ep, h->tag);
    struct ibv_mr *mr;

    if (!req || !ep->sq_avail)
        return;                 /* unexpected queue, retried from progress */
    req->sreq = h->sreq;
    ep->sq_avail--;

    if (h->len <= RNDV_MEDIUM_MAX) {
        /* medium get: pull into the landing zone of the RTS's slot, copy out later */
        char *zone = ep->slots + (size_t)slot * RNDV_SLOT_SIZE + RNDV_RX_SPACE;

        // BUG: rdma-access-flags-transport -- READ into slots registered by rdma_reg_msgs (local write only); iWARP rejects it
        rdma_post_read(ep->id, req, zone, h->len, ep->slot_mr, IBV_SEND_SIGNALED, h->addr, h->rkey);
        return;
    }

    mr = rndv_rcache_get(ep, req->buf, h->len);
    if (!mr)
        return;
    /* OK: rdma-access-flags-transport -- the cache gives the sink remote write where the device needs it */
    rdma_post_read(ep->id, req, req->buf, h->len, mr, IBV_SEND_SIGNALED, h->addr, h->rkey);
}

static void rndv_handle_fin(struct rndv_ep *ep, struct ibv_wc *wc, const struct rndv_hdr *h)
{
    struct rndv_req *req = (struct rndv_req *)(uintptr_t)h->sreq;

    (void)wc;
    if (req->pack_buf)
        free(req->pack_buf);    // BUG: rdma-invalidation-leak -- the pack buffer is freed before the MR over it is deregistered below
    ibv_dereg_mr(req->mr);      // BUG: rdma-registration-in-datapath -- deregistration per message in the FIN handler
    rndv_complete(req);
    free(req);
}

int rndv_cancel(struct rndv_ep *ep, struct rndv_req *req)
{
    (void)ep;
    if (req->done)
        return -EBUSY;
    /* OK: rdma-invalidation-leak -- deregistration kills the rkey before the memory is released */
    ibv_dereg_mr(req->mr);
    free(req->pack_buf);
    free(req);
    return 0;
}

void rndv_progress(struct rndv_ep *ep)
{
    struct ibv_wc wc[8];
    int n, i;

    n = ibv_poll_cq(ep->id->send_cq, 8, wc);
    for (i = 0; i < n; i++) {
        if (wc[i].opcode == IBV_WC_RDMA_READ && wc[i].status == IBV_WC_SUCCESS) {
            struct rndv_req *req = (struct rndv_req *)(uintptr_t)wc[i].wr_id;
            struct rndv_hdr fin = { .type = RNDV_MSG_FIN, .sreq = req->sreq };

            ep->sq_avail++;
            rndv_post_ctrl(ep, &fin, NULL, 0);
            rndv_complete(req);
        } else {
            ep->sq_avail += RNDV_SIG_INTERVAL;
        }
    }

    n = ibv_poll_cq(ep->id->recv_cq, 8, wc);
    for (i = 0; i < n; i++) {
        unsigned slot = (unsigned)wc[i].wr_id;
        char *buf = ep->slots + (size_t)slot * RNDV_SLOT_SIZE;
        const struct rndv_hdr *h = (const struct rndv_hdr *)buf;

        if (wc[i].status != IBV_WC_SUCCESS)
            continue;
        if (h->type == RNDV_MSG_EAGER)
            rndv_deliver_eager(ep, h, buf + sizeof(*h));
        else if (h->type == RNDV_MSG_RTS)
            rndv_handle_rts(ep, &wc[i], h);
        else if (h->type == RNDV_MSG_FIN)
            rndv_handle_fin(ep, &wc[i], h);
        rdma_post_recv(ep->id, (void *)(uintptr_t)slot, buf, RNDV_RX_SPACE, ep->slot_mr);
    }
}

void rndv_ep_destroy(struct rndv_ep *ep)
{
    struct rndv_rcache_ent *e;

    while ((e = ep->rcache)) {
        ep->rcache = e->next;
        /* OK: rdma-mr-leak -- each cached registration is released before its entry is freed */
        ibv_dereg_mr(e->mr);
        free(e);
    }
    rdma_dereg_mr(ep->ctrl_mr);
    free(ep->ctrl);
    rdma_dereg_mr(ep->slot_mr);
    free(ep->slots);
    rdma_destroy_ep(ep->id);
}
