/*
 * ua_uct_rc_rcache.c - UCT-style RC verbs transport with a registration cache.
 *
 * Zero-copy PUT/GET go through a registration cache (refcounted regions,
 * invalidated by a memory-event hook on munmap).  Rendezvous: the sender packs
 * the rkey of its cached region (or of a bounce buffer) into the RTS, the
 * receiver GETs with RDMA READ and chains a fenced ATS.  Send credits are
 * counted in WQEs; one moderated completion retires everything before it.
 *
 * Bugs: rcache miss path and purge leak MRs, init unwinds past one MR (and
 * frees its remote-writable memory under it), the GET bcopy bounce (a READ
 * sink) lacks REMOTE_WRITE, the rendezvous bounce is freed while its key is
 * live, the status block carries remote write nobody can use, the no-rcache
 * PUT registers once per operation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#define UCT_RC_AM_SEG_SIZE      8192
#define UCT_RC_AM_NUM_SEGS      256
#define UCT_RC_BOUNCE_SIZE      (256 * 1024)
#define UCT_RC_TX_MODERATION    32
#define UCT_RC_MAX_INLINE       188
#define UCT_RC_MAX_RNDV         64
#define UCT_RC_RCACHE_ACCESS    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define UCT_RC_REGION_INVALID   0x1

#define UCT_RC_CHECK_RES(_iface, _n) \
    do { if ((_iface)->tx_available < (_n)) return -EAGAIN; } while (0)

enum { UCT_RC_AM_ID_RTS = 1, UCT_RC_AM_ID_ATS };

typedef struct uct_rc_region {
    struct uct_rc_region *next;
    void                 *addr;
    size_t                length;
    struct ibv_mr        *mr;
    int                   refcount, flags;
} uct_rc_region_t;

typedef struct uct_rc_rcache {
    struct ibv_pd   *pd;
    uct_rc_region_t *regions;
} uct_rc_rcache_t;

typedef struct uct_rc_tx_desc {
    struct uct_rc_tx_desc *next;      /* free list / outstanding FIFO */
    uct_rc_region_t       *region;    /* zcopy: held until completion */
    struct ibv_mr         *mr;        /* uncached put zcopy */
    struct ibv_send_wr     wr, ats_wr;
    struct ibv_sge         sge, ats_sge;
} uct_rc_tx_desc_t;

typedef struct uct_rc_am_hdr {
    uint8_t  am_id;
    uint64_t rndv_id, address, length;
    uint32_t packed_rkey;
} __attribute__((packed)) uct_rc_am_hdr_t;

typedef struct uct_rc_iface {
    struct ibv_pd      *pd;
    struct ibv_cq      *cq;
    struct ibv_qp      *qp;         /* one QP: single-endpoint interface */
    uct_rc_rcache_t    *rcache;            /* NULL with RCACHE=n */
    void               *am_buf, *get_bounce, *rndv_bounce;
    struct ibv_mr      *am_mr, *get_bounce_mr, *rndv_bounce_mr;
    uct_rc_am_hdr_t    *status;            /* ATS headers, one per rndv slot */
    struct ibv_mr      *status_mr;
    uct_rc_tx_desc_t   *descs, *free_descs, *out_head, *out_tail;
    int                 tx_available;
    unsigned            tx_qp_len, unsignaled, pending_wqes, max_inline;
    uct_rc_region_t    *rndv_region[UCT_RC_MAX_RNDV];
    void             *(*rndv_recv_cb)(void *arg, size_t length);
    void               *rndv_arg;
} uct_rc_iface_t;

static void uct_rc_rcache_unlink(uct_rc_rcache_t *rcache, uct_rc_region_t *region)
{
    uct_rc_region_t **p;

    for (p = &rcache->regions; *p != NULL; p = &(*p)->next)
        if (*p == region) {
            *p = region->next;
            return;
        }
}

static uct_rc_region_t *
uct_rc_rcache_get(uct_rc_rcache_t *rcache, void *addr, size_t length)
{
    uct_rc_region_t *region;
    struct ibv_mr *mr;

    for (region = rcache->regions; region != NULL; region = region->next) {
        if (!(region->flags & UCT_RC_REGION_INVALID) &&
            ((char*)addr >= (char*)region->addr) &&
            ((char*)addr + length <= (char*)region->addr + region->length)) {
            region->refcount++;
            return region;
        }
    }
    /* OK: rdma-registration-in-datapath -- registration cache: registers only after the lookup missed */
    mr = ibv_reg_mr(rcache->pd, addr, length, UCT_RC_RCACHE_ACCESS); /* BUG: rdma-local-mr-management -- the region's rkey is packed into RTS headers for the peer */
    if (mr == NULL)
        return NULL;
    region = calloc(1, sizeof(*region));
    if (region == NULL)
        return NULL; /* BUG: rdma-mr-leak -- the MR just registered in 'mr' is dropped */
    region->addr   = addr;
    region->length = length;
    region->mr     = mr;
    region->refcount++;
    region->next    = rcache->regions;
    rcache->regions = region;
    return region;
}

static void uct_rc_rcache_put(uct_rc_rcache_t *rcache, uct_rc_region_t *region)
{
    if ((--region->refcount == 0) && (region->flags & UCT_RC_REGION_INVALID)) {
        uct_rc_rcache_unlink(rcache, region);
        ibv_dereg_mr(region->mr); /* OK: rdma-registration-in-datapath -- deferred destruction of a region invalidated by munmap, not per operation */
        free(region);
    }
}

/* memory-event hook: [addr, addr+length) is about to be unmapped */
void uct_rc_rcache_mem_event(uct_rc_rcache_t *rcache, void *addr, size_t length)
{
    uct_rc_region_t *region, *next;

    for (region = rcache->regions; region != NULL; region = next) {
        next = region->next;
        if ((char*)region->addr >= (char*)addr + length || (char*)region->addr + region->length <= (char*)addr)
            continue;
        region->flags |= UCT_RC_REGION_INVALID;
        if (region->refcount == 0) {
            uct_rc_rcache_unlink(rcache, region);
            ibv_dereg_mr(region->mr);
            free(region);
        }
    }
}

static void uct_rc_rcache_cleanup(uct_rc_rcache_t *rcache)
{
    uct_rc_region_t *region;

    while ((region = rcache->regions) != NULL) {
        rcache->regions = region->next;
        if (region->refcount > 0) {
            fprintf(stderr, "rcache: destroying inuse region %p rkey 0x%x\n", region->addr, region->mr->rkey);
            free(region); /* BUG: rdma-mr-leak, rdma-invalidation-leak -- the in-use region (its rkey out in an RTS) is freed with its MR still registered */
            continue;
        }
        ibv_dereg_mr(region->mr);
        free(region);
    }
    free(rcache);
}

static uct_rc_tx_desc_t *uct_rc_iface_get_desc(uct_rc_iface_t *iface)
{
    uct_rc_tx_desc_t *desc = iface->free_descs;

    if (desc != NULL) {
        iface->free_descs = desc->next;
        memset(desc, 0, sizeof(*desc));
    }
    return desc;
}

static int uct_rc_iface_tx_moderation(uct_rc_iface_t *iface)
{
    if (++iface->unsignaled >= UCT_RC_TX_MODERATION) {
        iface->unsignaled = 0;
        return IBV_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- the counter is advanced above; every 32nd WQE is signaled */
    }
    return 0;
}

static void uct_rc_wr_fill(uct_rc_iface_t *iface, uct_rc_tx_desc_t *desc,
                           struct ibv_send_wr *wr, struct ibv_sge *sge,
                           enum ibv_wr_opcode opcode, void *addr, size_t length,
                           uint32_t lkey, uint64_t remote_addr, uint32_t rkey)
{
    sge->addr               = (uintptr_t)addr;
    sge->length             = length;
    sge->lkey               = lkey;
    wr->wr_id               = (uintptr_t)desc;
    wr->sg_list             = sge;
    wr->num_sge             = 1;
    wr->opcode              = opcode;
    wr->send_flags          = uct_rc_iface_tx_moderation(iface);
    wr->wr.rdma.remote_addr = remote_addr;
    wr->wr.rdma.rkey        = rkey;
}

static void uct_rc_iface_complete_desc(uct_rc_iface_t *iface, uct_rc_tx_desc_t *desc)
{
    if (desc->region != NULL)
        uct_rc_rcache_put(iface->rcache, desc->region);
    if (desc->mr != NULL)
        ibv_dereg_mr(desc->mr); /* BUG: rdma-registration-in-datapath -- deregisters the per-operation PUT registration on every completion */
    desc->next = iface->free_descs;
    iface->free_descs = desc;
}

static int uct_rc_iface_post(uct_rc_iface_t *iface, uct_rc_tx_desc_t *desc, int wqes)
{
    struct ibv_send_wr *bad_wr;
    int ret;

    if ((ret = ibv_post_send(iface->qp, &desc->wr, &bad_wr)) != 0) {
        uct_rc_iface_complete_desc(iface, desc);
        return -ret;
    }
    iface->tx_available -= wqes;
    iface->pending_wqes += wqes;
    desc->next = NULL;
    *(iface->out_tail ? &iface->out_tail->next : &iface->out_head) = desc;
    iface->out_tail = desc;
    return 0;
}

int uct_rc_ep_put_zcopy_direct(uct_rc_iface_t *iface, void *buffer, size_t length,
                               uint64_t remote_addr, uint32_t rkey)
{
    uct_rc_tx_desc_t *desc;

    UCT_RC_CHECK_RES(iface, 1);
    if ((desc = uct_rc_iface_get_desc(iface)) == NULL)
        return -EAGAIN;
    desc->mr = ibv_reg_mr(iface->pd, buffer, length, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- registers the user buffer for every PUT (no rcache) */
    if (desc->mr == NULL) {
        uct_rc_iface_complete_desc(iface, desc);
        return -errno;
    }
    uct_rc_wr_fill(iface, desc, &desc->wr, &desc->sge, IBV_WR_RDMA_WRITE, buffer, length,
                   desc->mr->lkey, remote_addr, rkey);
    return uct_rc_iface_post(iface, desc, 1);
}

int uct_rc_ep_get_bcopy(uct_rc_iface_t *iface, size_t offset, size_t length,
                        uint64_t remote_addr, uint32_t rkey)
{
    uct_rc_tx_desc_t *desc;

    UCT_RC_CHECK_RES(iface, 1);
    if (offset + length > UCT_RC_BOUNCE_SIZE)
        return -EMSGSIZE;
    if ((desc = uct_rc_iface_get_desc(iface)) == NULL)
        return -EAGAIN;
    uct_rc_wr_fill(iface, desc, &desc->wr, &desc->sge, IBV_WR_RDMA_READ, (char*)iface->get_bounce + offset, length, iface->get_bounce_mr->lkey, remote_addr, rkey); /* BUG: rdma-access-flags-transport -- READ into get_bounce_mr, registered with LOCAL_WRITE only; fails on iWARP */
    return uct_rc_iface_post(iface, desc, 1);
}

/* receiver side of the rendezvous: GET the payload, then a fenced ATS */
static int uct_rc_rndv_handle_rts(uct_rc_iface_t *iface, const uct_rc_am_hdr_t *rts)
{
    uct_rc_am_hdr_t *ats = &iface->status[rts->rndv_id % UCT_RC_MAX_RNDV];
    uct_rc_tx_desc_t *desc;
    uct_rc_region_t *region;
    void *buffer;

    UCT_RC_CHECK_RES(iface, 2);
    buffer = iface->rndv_recv_cb(iface->rndv_arg, rts->length);
    if ((desc = uct_rc_iface_get_desc(iface)) == NULL)
        return -EAGAIN;
    region = uct_rc_rcache_get(iface->rcache, buffer, rts->length);
    if (region == NULL) {
        uct_rc_iface_complete_desc(iface, desc);
        return -ENOMEM;
    }
    desc->region  = region;
    /* OK: rdma-access-flags-transport -- the sink comes from the rcache, registered with REMOTE_WRITE */
    uct_rc_wr_fill(iface, desc, &desc->wr, &desc->sge, IBV_WR_RDMA_READ, buffer, rts->length,
                   region->mr->lkey, rts->address, ntohl(rts->packed_rkey));
    desc->wr.next = &desc->ats_wr;
    ats->am_id    = UCT_RC_AM_ID_ATS;
    ats->rndv_id  = rts->rndv_id;
    uct_rc_wr_fill(iface, desc, &desc->ats_wr, &desc->ats_sge, IBV_WR_SEND, ats, sizeof(*ats),
                   iface->status_mr->lkey, 0, 0);
    desc->ats_wr.send_flags |= IBV_SEND_FENCE;
    return uct_rc_iface_post(iface, desc, 2); /* OK: rdma-send-queue-undersized -- the READ+ATS chain is gated by UCT_RC_CHECK_RES(iface, 2) on WQE credits */
}

/* sender side of the rendezvous: expose the buffer and send the RTS */
int uct_rc_ep_rndv_send(uct_rc_iface_t *iface, void *buffer, size_t length, unsigned slot)
{
    uct_rc_am_hdr_t rts = { .am_id = UCT_RC_AM_ID_RTS, .rndv_id = slot, .length = length };
    uct_rc_region_t *region = NULL;
    uct_rc_tx_desc_t *desc;
    int ret = -EAGAIN;

    UCT_RC_CHECK_RES(iface, 1);
    if ((slot >= UCT_RC_MAX_RNDV) || (sizeof(rts) > iface->max_inline))
        return -EINVAL;
    if ((iface->rcache != NULL) &&
        ((region = uct_rc_rcache_get(iface->rcache, buffer, length)) != NULL)) {
        rts.address     = (uintptr_t)buffer;
        rts.packed_rkey = htonl(region->mr->rkey);
    } else if (length <= UCT_RC_BOUNCE_SIZE) {
        memcpy(iface->rndv_bounce, buffer, length);
        rts.address     = (uintptr_t)iface->rndv_bounce;
        rts.packed_rkey = htonl(iface->rndv_bounce_mr->rkey);
    } else {
        return -EMSGSIZE;
    }
    if ((desc = uct_rc_iface_get_desc(iface)) != NULL) {
        uct_rc_wr_fill(iface, desc, &desc->wr, &desc->sge, IBV_WR_SEND, &rts, sizeof(rts), 0, 0, 0);
        desc->wr.send_flags |= IBV_SEND_INLINE;
        ret = uct_rc_iface_post(iface, desc, 1);
    }
    if (ret < 0) {
        if (region != NULL)
            uct_rc_rcache_put(iface->rcache, region);
        return ret;
    }
    iface->rndv_region[slot] = region;
    return 0;
}

unsigned uct_rc_iface_progress(uct_rc_iface_t *iface)
{
    struct ibv_wc wc[16];
    uct_rc_tx_desc_t *desc, *last;
    uct_rc_am_hdr_t *hdr;
    int i, n;

    n = ibv_poll_cq(iface->cq, 16, wc);
    for (i = 0; i < n; i++) {
        if (wc[i].opcode & IBV_WC_RECV) {
            hdr = (uct_rc_am_hdr_t*)((char*)iface->am_buf + wc[i].wr_id * UCT_RC_AM_SEG_SIZE);
            if (hdr->am_id == UCT_RC_AM_ID_RTS) {
                uct_rc_rndv_handle_rts(iface, hdr);
            } else if ((hdr->am_id == UCT_RC_AM_ID_ATS) && (hdr->rndv_id < UCT_RC_MAX_RNDV) &&
                       (iface->rndv_region[hdr->rndv_id] != NULL)) {
                uct_rc_rcache_put(iface->rcache, iface->rndv_region[hdr->rndv_id]);
                iface->rndv_region[hdr->rndv_id] = NULL;
            }
            continue;
        }
        /* one signaled completion retires every WQE posted before it */
        last = (uct_rc_tx_desc_t*)(uintptr_t)wc[i].wr_id;
        iface->tx_available += iface->pending_wqes;
        iface->pending_wqes  = 0;
        do {
            desc = iface->out_head;
            iface->out_head = desc->next;
            uct_rc_iface_complete_desc(iface, desc);
        } while ((desc != last) && (iface->out_head != NULL));
        iface->out_tail = iface->out_head ? iface->out_tail : NULL;
    }
    return n;
}

static int uct_rc_iface_create_qp(uct_rc_iface_t *iface)
{
    struct ibv_qp_init_attr attr = {
        .send_cq = iface->cq, .recv_cq = iface->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
        .cap = { .max_send_wr = iface->tx_qp_len, .max_recv_wr = UCT_RC_AM_NUM_SEGS,
                 .max_send_sge = 2, .max_recv_sge = 1,
                 .max_inline_data = UCT_RC_MAX_INLINE }, /* OK: rdma-queue-cap-unchecked -- the granted inline size is read back from attr.cap below */
    };

    iface->qp = ibv_create_qp(iface->pd, &attr);
    if (iface->qp == NULL)
        return -errno;
    iface->max_inline   = attr.cap.max_inline_data;
    iface->tx_available = attr.cap.max_send_wr;
    return 0;
}

int uct_rc_iface_init(uct_rc_iface_t *iface, struct ibv_context *ctx, int use_rcache)
{
    size_t am_size = UCT_RC_AM_SEG_SIZE * UCT_RC_AM_NUM_SEGS;
    unsigned i;

    memset(iface, 0, sizeof(*iface));
    iface->tx_qp_len = 256;
    if ((iface->pd = ibv_alloc_pd(ctx)) == NULL)
        return -ENOMEM;
    if ((iface->cq = ibv_create_cq(ctx, iface->tx_qp_len + UCT_RC_AM_NUM_SEGS, NULL, NULL, 0)) == NULL)
        goto err_dealloc_pd;
    iface->am_buf = aligned_alloc(4096, am_size);
    iface->am_mr  = ibv_reg_mr(iface->pd, iface->am_buf, am_size, IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- AM receive ring registered once for local access */
    if (iface->am_mr == NULL)
        goto err_free;
    iface->get_bounce    = aligned_alloc(4096, UCT_RC_BOUNCE_SIZE);
    iface->get_bounce_mr = ibv_reg_mr(iface->pd, iface->get_bounce, UCT_RC_BOUNCE_SIZE, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- local side of the interface's own RDMA READ (get_bcopy) */
    if (iface->get_bounce_mr == NULL)
        goto err_dereg_am; /* OK: rdma-mr-leak -- am_mr is deregistered on this path */
    iface->rndv_bounce    = aligned_alloc(4096, UCT_RC_BOUNCE_SIZE);
    iface->rndv_bounce_mr = ibv_reg_mr(iface->pd, iface->rndv_bounce, UCT_RC_BOUNCE_SIZE, IBV_ACCESS_REMOTE_READ); /* BUG: rdma-local-mr-management -- rkey is packed into RTS headers */
    if (iface->rndv_bounce_mr == NULL)
        goto err_dereg_get;
    iface->status = calloc(UCT_RC_MAX_RNDV, sizeof(uct_rc_am_hdr_t));
    /* OK: rdma-access-flags-invalid -- REMOTE_WRITE comes with LOCAL_WRITE */
    iface->status_mr = ibv_reg_mr(iface->pd, iface->status, UCT_RC_MAX_RNDV * sizeof(*iface->status), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* BUG(file): rdma-remote-access-overbroad -- only status_mr->lkey is used (ATS source); no peer ever gets this rkey */
    if (iface->status_mr == NULL)
        goto err_dereg_rndv;
    if (uct_rc_iface_create_qp(iface) != 0)
        goto err_dereg_rndv; /* BUG: rdma-mr-leak, rdma-invalidation-leak -- status_mr is never deregistered on this path, and err_free frees its REMOTE_WRITE memory under it */
    iface->descs = calloc(iface->tx_qp_len, sizeof(*iface->descs));
    for (i = 0; (iface->descs != NULL) && (i < iface->tx_qp_len); i++) {
        iface->descs[i].next = iface->free_descs;
        iface->free_descs    = &iface->descs[i];
    }
    if (use_rcache && ((iface->rcache = calloc(1, sizeof(*iface->rcache))) != NULL))
        iface->rcache->pd = iface->pd;
    return 0;

err_dereg_rndv:
    ibv_dereg_mr(iface->rndv_bounce_mr);
err_dereg_get:
    ibv_dereg_mr(iface->get_bounce_mr);
err_dereg_am:
    ibv_dereg_mr(iface->am_mr);
err_free:
    free(iface->status);
    free(iface->rndv_bounce);
    free(iface->get_bounce);
    free(iface->am_buf);
    ibv_destroy_cq(iface->cq);
err_dealloc_pd:
    ibv_dealloc_pd(iface->pd);
    return -ENOMEM;
}

void uct_rc_iface_cleanup(uct_rc_iface_t *iface)
{
    if (iface->rcache != NULL) uct_rc_rcache_cleanup(iface->rcache);
    ibv_dereg_mr(iface->status_mr);
    free(iface->status);
    free(iface->rndv_bounce); /* BUG: rdma-invalidation-leak -- freed while rndv_bounce_mr (REMOTE_READ, rkey sent in RTS) is still registered */
    ibv_dereg_mr(iface->rndv_bounce_mr);
    ibv_dereg_mr(iface->get_bounce_mr);
    free(iface->get_bounce);
    free(iface->am_buf); /* OK: rdma-invalidation-leak -- am_mr is local-only; no key was handed out */
    ibv_dereg_mr(iface->am_mr);
    free(iface->descs);
    ibv_destroy_qp(iface->qp);
    ibv_destroy_cq(iface->cq);
    ibv_dealloc_pd(iface->pd);
}
