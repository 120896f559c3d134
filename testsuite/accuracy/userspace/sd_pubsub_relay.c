/*
 * sd_pubsub_relay.c - topic relay for a small publish/subscribe bus.
 *
 * Subscribers connect with rdma_cm and name a topic and their message ring
 * (addr, rkey, slot count, slot size) in the private data.  A published
 * message is staged in a slot of the relay's pre-registered pool and
 * delivered to every subscriber of the topic as an RDMA WRITE into the
 * subscriber's ring followed by an inline descriptor SEND.  A delivery is
 * only posted while fewer than cfg.window deliveries to that subscriber are
 * unretired (a signaled completion retires everything before it), and every
 * cfg.sig_batch-th delivery is signaled.
 *
 * The relay also keeps a control link to an upstream relay (heartbeats,
 * subscription changes), a second kind of QP created with rdma_create_ep().
 *
 * Every queue size comes from relay_cfg_t (defaults, overridable from the
 * environment) and is fitted to the device in relay_cfg_fit().
 *
 * Known problems: the control link never asks for a completion and requests
 * 512 bytes of inline data it never checks, and its message MR is not
 * deregistered on close; the pool's unwinding loop forgets the slot whose
 * header allocation failed.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad -- not the subject of this file
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- not the subject of this file
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath -- not the subject of this file
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define RELAY_WR_PER_MSG        2       /* payload WRITE + descriptor SEND */
#define RELAY_DEF_WINDOW        256
#define RELAY_DEF_RQ_DEPTH      4096
#define RELAY_DEF_SIG_BATCH     32
#define RELAY_DEF_MSG_SIZE      4096
#define RELAY_DEF_POOL          1024
#define RELAY_CTRL_DEPTH        64
#define RELAY_CTRL_INLINE       512
#define RELAY_CTRL_MSG_MAX      2048

typedef enum {
    RELAY_OK = 0, RELAY_ERR_NO_MEM = -1, RELAY_ERR_IO = -2, RELAY_ERR_BUSY = -3, RELAY_ERR_INVALID = -4,
} relay_status_t;

#define relay_error(_fmt, ...) fprintf(stderr, "[relay] " _fmt "\n", ## __VA_ARGS__)

typedef struct relay_cfg {
    uint32_t    window;         /* unretired deliveries per subscriber */
    uint32_t    rq_depth, sig_batch, msg_size, pool_size;
    const char  *upstream, *upstream_port;
    uint16_t    port;
} relay_cfg_t;

typedef struct relay_desc    { uint32_t topic, len, index, seq; } relay_desc_t;
typedef struct relay_ctrl_hdr { uint16_t type, flags; uint32_t len; uint64_t seq; } relay_ctrl_hdr_t;
typedef struct relay_sub_priv {
    uint64_t ring_addr;
    uint32_t ring_rkey, ring_slots, slot_size, topic;
} relay_sub_priv_t;

enum { RELAY_CTRL_HEARTBEAT = 1, RELAY_CTRL_SUBSCRIBE, RELAY_CTRL_UNSUBSCRIBE };

typedef struct relay_slot {
    void                *buf;
    struct ibv_mr       *mr;
    relay_desc_t        *hdr;
    uint32_t            refs;
    struct relay_slot   *next;
} relay_slot_t;

typedef struct relay_pool { relay_slot_t *slots, *free_list; uint32_t count; } relay_pool_t;
typedef struct relay_tx   { struct relay_sub *sub; relay_slot_t *slot; uint64_t seq; } relay_tx_t;

typedef struct relay_sub {
    struct rdma_cm_id   *id;
    struct ibv_qp       *qp;
    uint64_t            ring_addr;
    uint32_t            ring_rkey, ring_slots, slot_size, ring_head;
    uint32_t            topic;
    uint64_t            posted;         /* deliveries posted */
    uint64_t            retired;        /* deliveries known complete */
    relay_tx_t          *tx;            /* cfg.window entries */
    relay_desc_t        *rx;            /* subscriber acks, not interpreted */
    struct ibv_mr       *rx_mr;
    struct relay_sub    *next;
} relay_sub_t;

typedef struct relay_ctrl {
    struct rdma_cm_id   *id;
    struct ibv_qp       *qp;
    char                *msg_buf;
    struct ibv_mr       *msg_mr;
    uint64_t            seq;
    int                 up;
} relay_ctrl_t;

typedef struct relay {
    relay_cfg_t                 cfg;
    struct rdma_event_channel   *ec;
    struct rdma_cm_id           *listen_id;
    struct ibv_context          *verbs;
    struct ibv_pd               *pd;
    struct ibv_cq               *cq;
    relay_pool_t                pool;
    relay_sub_t                 *subs;
    relay_ctrl_t                ctrl;
} relay_t;

static uint32_t relay_env_u32(const char *name, uint32_t dflt)
{
    const char *v = getenv(name);

    return v ? (uint32_t)strtoul(v, NULL, 0) : dflt;
}

static void relay_cfg_init(relay_cfg_t *cfg)
{
    cfg->window        = relay_env_u32("RELAY_WINDOW", RELAY_DEF_WINDOW);
    cfg->rq_depth      = relay_env_u32("RELAY_RQ_DEPTH", RELAY_DEF_RQ_DEPTH);
    cfg->sig_batch     = relay_env_u32("RELAY_SIG_BATCH", RELAY_DEF_SIG_BATCH);
    cfg->msg_size      = relay_env_u32("RELAY_MSG_SIZE", RELAY_DEF_MSG_SIZE);
    cfg->pool_size     = relay_env_u32("RELAY_POOL", RELAY_DEF_POOL);
    cfg->port          = (uint16_t)relay_env_u32("RELAY_PORT", 7471);
    cfg->upstream      = getenv("RELAY_UPSTREAM");
    cfg->upstream_port = "7471";
}

static void relay_cfg_fit(relay_cfg_t *cfg, const struct ibv_device_attr *dattr)
{
    uint32_t max_wr = (uint32_t)dattr->max_qp_wr;

    if (cfg->window == 0 || cfg->window > (max_wr - 1) / RELAY_WR_PER_MSG)
        cfg->window = (max_wr - 1) / RELAY_WR_PER_MSG;
    if (cfg->rq_depth == 0 || cfg->rq_depth > max_wr)
        cfg->rq_depth = max_wr;
    if (cfg->sig_batch == 0 || cfg->sig_batch > cfg->window)
        cfg->sig_batch = cfg->window;
}

static uint32_t relay_sq_size(const relay_cfg_t *cfg)
{
    return cfg->window * RELAY_WR_PER_MSG + 1;
}

static relay_status_t relay_pool_init(relay_t *r)
{
    relay_pool_t *p = &r->pool;
    relay_slot_t *s;
    uint32_t i;

    p->count = r->cfg.pool_size;
    p->slots = calloc(p->count, sizeof(*p->slots));
    if (p->slots == NULL)
        return RELAY_ERR_NO_MEM;

    for (i = 0; i < p->count; i++) {
        s = &p->slots[i];
        s->buf = aligned_alloc(64, r->cfg.msg_size);
        if (s->buf == NULL)
            goto unwind;        /* OK: rdma-mr-leak -- slot i has no MR yet, slots 0..i-1 are released below */
        s->mr = ibv_reg_mr(r->pd, s->buf, r->cfg.msg_size, 0);
        if (s->mr == NULL) {
            free(s->buf);
            goto unwind;
        }
        s->hdr = calloc(1, sizeof(*s->hdr));
        if (s->hdr == NULL) {
            free(s->buf);
            goto unwind;        /* BUG: rdma-mr-leak -- slot i's MR is registered but the unwinding loop stops below i */
        }
        s->next = p->free_list;
        p->free_list = s;
    }
    return RELAY_OK;

unwind:
    while (i--) {
        ibv_dereg_mr(p->slots[i].mr);
        free(p->slots[i].buf);
        free(p->slots[i].hdr);
    }
    free(p->slots);
    p->slots = NULL;
    p->free_list = NULL;
    return RELAY_ERR_NO_MEM;
}

static void relay_pool_fini(relay_t *r)
{
    uint32_t i;

    for (i = 0; i < r->pool.count && r->pool.slots != NULL; i++) {
        ibv_dereg_mr(r->pool.slots[i].mr);
        free(r->pool.slots[i].buf);
        free(r->pool.slots[i].hdr);
    }
    free(r->pool.slots);
}

static void relay_slot_put(relay_t *r, relay_slot_t *s)
{
    if (--s->refs == 0) {
        s->next = r->pool.free_list;
        r->pool.free_list = s;
    }
}

static relay_status_t relay_sub_create_qp(relay_t *r, relay_sub_t *sub)
{
    struct ibv_qp_init_attr attr;

    memset(&attr, 0, sizeof(attr));
    attr.send_cq = r->cq;
    attr.recv_cq = r->cq;
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    /* OK: rdma-send-queue-manual-factor -- RELAY_WR_PER_MSG counts the two data WRs of a delivery; the relay posts no registration */
    attr.cap.max_send_wr = relay_sq_size(&r->cfg);  /* OK: rdma-send-queue-undersized -- a delivery posts two WRs and at most cfg.window of them are unretired */
    attr.cap.max_recv_wr = r->cfg.rq_depth;         /* OK: rdma-queue-cap-unchecked -- the 4096 default was fitted to max_qp_wr in relay_cfg_fit() */
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = sizeof(relay_desc_t);
    if (rdma_create_qp(sub->id, r->pd, &attr)) {
        relay_error("rdma_create_qp: %s", strerror(errno));
        return RELAY_ERR_IO;
    }
    sub->qp = sub->id->qp;
    return RELAY_OK;
}

static void relay_sub_retire(relay_t *r, relay_sub_t *sub, uint64_t seq)
{
    while (sub->retired < seq) {
        relay_tx_t *tx = &sub->tx[sub->retired % r->cfg.window];

        relay_slot_put(r, tx->slot);
        sub->retired++;
    }
}

static relay_status_t relay_deliver(relay_t *r, relay_sub_t *sub, relay_slot_t *slot)
{
    struct ibv_send_wr wr[2], *bad_wr;
    struct ibv_sge sge, dsge;
    relay_desc_t desc;
    relay_tx_t *tx;

    if (sub->posted - sub->retired >= r->cfg.window)
        return RELAY_ERR_BUSY;          /* slow subscriber: it resyncs from desc.seq */
    if (slot->hdr->len > sub->slot_size)
        return RELAY_ERR_INVALID;

    desc = *slot->hdr;
    desc.index = sub->ring_head;
    sub->ring_head = (sub->ring_head + 1) % sub->ring_slots;

    sge  = (struct ibv_sge){ (uintptr_t)slot->buf, slot->hdr->len, slot->mr->lkey };
    dsge = (struct ibv_sge){ (uintptr_t)&desc, sizeof(desc), 0 };

    tx = &sub->tx[sub->posted % r->cfg.window];
    *tx = (relay_tx_t){ sub, slot, sub->posted + 1 };

    memset(wr, 0, sizeof(wr));
    wr[0].opcode              = IBV_WR_RDMA_WRITE;
    wr[0].sg_list             = &sge;
    wr[0].num_sge             = 1;
    wr[0].wr.rdma.remote_addr = sub->ring_addr + (uint64_t)desc.index * sub->slot_size;
    wr[0].wr.rdma.rkey        = sub->ring_rkey;
    wr[0].next                = &wr[1];
    wr[1].wr_id               = (uintptr_t)tx;
    wr[1].opcode              = IBV_WR_SEND;
    wr[1].sg_list             = &dsge;
    wr[1].num_sge             = 1;
    wr[1].send_flags          = IBV_SEND_INLINE;
    if ((sub->posted++ % r->cfg.sig_batch) == 0)    /* OK: rdma-unsignaled-send-starvation -- posted advances with every delivery */
        wr[1].send_flags |= IBV_SEND_SIGNALED;

    slot->refs++;
    if (ibv_post_send(sub->qp, wr, &bad_wr)) {
        sub->posted--;
        slot->refs--;
        return RELAY_ERR_IO;
    }
    return RELAY_OK;
}

static relay_status_t relay_publish(relay_t *r, uint32_t topic, const void *data, uint32_t len)
{
    relay_slot_t *slot = r->pool.free_list;
    relay_sub_t *sub;
    static uint32_t seq;

    if (slot == NULL)
        return RELAY_ERR_BUSY;
    if (len > r->cfg.msg_size)
        return RELAY_ERR_INVALID;
    r->pool.free_list = slot->next;
    memcpy(slot->buf, data, len);
    slot->hdr->topic = topic;
    slot->hdr->len   = len;
    slot->hdr->seq   = ++seq;
    slot->refs       = 1;

    for (sub = r->subs; sub != NULL; sub = sub->next) {
        if (sub->topic == topic && relay_deliver(r, sub, slot) != RELAY_OK)
            relay_error("subscriber %p: dropped seq %u", (void *)sub, seq);
    }
    relay_slot_put(r, slot);
    return RELAY_OK;
}

static relay_status_t relay_ctrl_connect(relay_t *r)
{
    relay_ctrl_t *c = &r->ctrl;
    struct rdma_addrinfo hints, *res;
    struct ibv_qp_init_attr attr;

    memset(&hints, 0, sizeof(hints));
    hints.ai_port_space = RDMA_PS_TCP;
    if (rdma_getaddrinfo(r->cfg.upstream, r->cfg.upstream_port, &hints, &res))
        return RELAY_ERR_IO;

    memset(&attr, 0, sizeof(attr));
    attr.cap.max_send_wr = RELAY_CTRL_DEPTH;        /* OK: rdma-send-queue-undersized -- a plain entry count; every control message is one SEND */
    attr.cap.max_recv_wr = RELAY_CTRL_DEPTH;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = RELAY_CTRL_INLINE;   /* BUG: rdma-queue-cap-unchecked -- 512 bytes of inline data, never compared with the device and never read back */
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    if (rdma_create_ep(&c->id, res, NULL, &attr)) {
        relay_error("rdma_create_ep %s: %s", r->cfg.upstream, strerror(errno));
        rdma_freeaddrinfo(res);
        return RELAY_ERR_IO;
    }
    rdma_freeaddrinfo(res);
    c->qp = c->id->qp;

    c->msg_buf = calloc(1, RELAY_CTRL_MSG_MAX);
    if (c->msg_buf == NULL)
        goto err_ep;
    c->msg_mr = ibv_reg_mr(c->id->pd, c->msg_buf, RELAY_CTRL_MSG_MAX, 0);
    if (c->msg_mr == NULL)
        goto err_buf;
    if (rdma_connect(c->id, NULL))
        goto err_mr;            /* OK: rdma-mr-leak -- err_mr deregisters msg_mr */
    c->up = 1;
    return RELAY_OK;

err_mr:
    ibv_dereg_mr(c->msg_mr);
err_buf:
    free(c->msg_buf);
err_ep:
    rdma_destroy_ep(c->id);
    return RELAY_ERR_IO;
}

static void relay_ctrl_close(relay_t *r)
{
    relay_ctrl_t *c = &r->ctrl;

    if (c->id == NULL)
        return;
    if (c->up)
        rdma_disconnect(c->id);
    free(c->msg_buf);           /* BUG(file): rdma-mr-leak -- msg_mr is never deregistered on close; the buffer goes while still registered */
    c->msg_buf = NULL;
    rdma_destroy_ep(c->id);
    c->id = NULL;
    c->up = 0;
}

static relay_status_t relay_ctrl_send(relay_t *r, uint16_t type, const void *payload, uint32_t len)
{
    relay_ctrl_t *c = &r->ctrl;
    relay_ctrl_hdr_t *hdr = (relay_ctrl_hdr_t *)c->msg_buf;
    uint32_t total = sizeof(*hdr) + len;
    struct ibv_send_wr wr, *bad_wr;
    struct ibv_sge sge;

    if (!c->up)
        return RELAY_ERR_IO;
    if (total > RELAY_CTRL_MSG_MAX)
        return RELAY_ERR_INVALID;
    *hdr = (relay_ctrl_hdr_t){ type, 0, len, ++c->seq };
    memcpy(hdr + 1, payload, len);

    sge = (struct ibv_sge){ (uintptr_t)c->msg_buf, total, c->msg_mr->lkey };
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    /* control traffic is small and rare; nobody waits for its completion */
    wr.send_flags = total <= RELAY_CTRL_INLINE ? IBV_SEND_INLINE : 0;  /* BUG(file): rdma-unsignaled-send-starvation -- the control QP is sq_sig_all = 0 and no post on it ever sets IBV_SEND_SIGNALED; after RELAY_CTRL_DEPTH messages every post fails */
    if (ibv_post_send(c->qp, &wr, &bad_wr)) {
        relay_error("control link: post failed, marking it down");
        c->up = 0;
        return RELAY_ERR_IO;
    }
    return RELAY_OK;
}

static relay_status_t relay_accept_sub(relay_t *r, struct rdma_cm_event *ev)
{
    const relay_sub_priv_t *priv = ev->param.conn.private_data;
    struct rdma_conn_param cp;
    relay_sub_t *sub;
    uint32_t i;

    if (priv == NULL || ev->param.conn.private_data_len < sizeof(*priv) || !priv->ring_slots)
        return RELAY_ERR_INVALID;
    sub = calloc(1, sizeof(*sub));
    if (sub == NULL)
        return RELAY_ERR_NO_MEM;
    sub->id = ev->id;
    sub->ring_addr = priv->ring_addr;
    sub->ring_rkey = priv->ring_rkey;
    sub->ring_slots = priv->ring_slots;
    sub->slot_size = priv->slot_size;
    sub->topic = priv->topic;
    sub->tx = calloc(r->cfg.window, sizeof(*sub->tx));
    sub->rx = calloc(r->cfg.rq_depth, sizeof(*sub->rx));
    if (sub->tx == NULL || sub->rx == NULL)
        goto err_free;
    sub->rx_mr = ibv_reg_mr(r->pd, sub->rx, r->cfg.rq_depth * sizeof(*sub->rx), IBV_ACCESS_LOCAL_WRITE);
    if (sub->rx_mr == NULL)
        goto err_free;
    if (relay_sub_create_qp(r, sub) != RELAY_OK)
        goto err_dereg;         /* OK: rdma-mr-leak -- err_dereg releases rx_mr */
    for (i = 0; i < r->cfg.rq_depth; i++) {
        struct ibv_sge sge = { (uintptr_t)&sub->rx[i], sizeof(sub->rx[i]), sub->rx_mr->lkey };
        struct ibv_recv_wr rwr = { .wr_id = (uintptr_t)sub, .sg_list = &sge, .num_sge = 1 }, *bad;

        if (ibv_post_recv(sub->qp, &rwr, &bad))
            goto err_qp;
    }
    memset(&cp, 0, sizeof(cp));
    cp.rnr_retry_count = 7;
    if (rdma_accept(sub->id, &cp))
        goto err_qp;
    sub->id->context = sub;
    sub->next = r->subs;
    r->subs = sub;
    return RELAY_OK;

err_qp:
    rdma_destroy_qp(sub->id);
err_dereg:
    ibv_dereg_mr(sub->rx_mr);
err_free:
    free(sub->rx);
    free(sub->tx);
    free(sub);
    return RELAY_ERR_NO_MEM;
}

static void relay_drop_sub(relay_t *r, relay_sub_t *sub)
{
    relay_sub_t **pp;

    for (pp = &r->subs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == sub) {
            *pp = sub->next;
            break;
        }
    }
    rdma_destroy_qp(sub->id);
    relay_sub_retire(r, sub, sub->posted);
    ibv_dereg_mr(sub->rx_mr);
    rdma_destroy_id(sub->id);
    free(sub->rx);
    free(sub->tx);
    free(sub);
}

static void relay_poll(relay_t *r)
{
    struct ibv_wc wc[32];
    int n, i;

    n = ibv_poll_cq(r->cq, 32, wc);
    for (i = 0; i < n; i++) {
        if (wc[i].opcode & IBV_WC_RECV) {
            /* subscribers only send a goodbye before they disconnect */
            continue;
        }
        if (wc[i].status == IBV_WC_SUCCESS) {
            relay_tx_t *tx = (relay_tx_t *)(uintptr_t)wc[i].wr_id;

            relay_sub_retire(r, tx->sub, tx->seq);
        }
    }
}

int main(void)
{
    relay_t *r = calloc(1, sizeof(*r));
    struct ibv_device_attr dattr;
    struct sockaddr_in sin = { .sin_family = AF_INET };
    struct ibv_context **devs;
    struct rdma_cm_event *ev;
    time_t last_hb = 0;
    char line[1024];
    int ndev, rc = 1;

    if (r == NULL)
        return 1;
    relay_cfg_init(&r->cfg);
    devs = rdma_get_devices(&ndev);
    if (devs == NULL || ndev == 0 || ibv_query_device(devs[0], &dattr))
        return 1;
    r->verbs = devs[0];
    relay_cfg_fit(&r->cfg, &dattr);
    r->pd = ibv_alloc_pd(r->verbs);
    r->cq = ibv_create_cq(r->verbs, dattr.max_cqe, r, NULL, 0);
    if (r->pd == NULL || r->cq == NULL || relay_pool_init(r) != RELAY_OK)
        return 1;

    r->ec = rdma_create_event_channel();
    if (r->ec == NULL || rdma_create_id(r->ec, &r->listen_id, NULL, RDMA_PS_TCP))
        goto out_pool;
    sin.sin_port = htons(r->cfg.port);
    if (rdma_bind_addr(r->listen_id, (struct sockaddr *)&sin) || rdma_listen(r->listen_id, 64))
        goto out_listen;
    if (r->cfg.upstream != NULL && relay_ctrl_connect(r) != RELAY_OK)
        relay_error("no upstream, running standalone");
    fcntl(r->ec->fd, F_SETFL, fcntl(r->ec->fd, F_GETFL) | O_NONBLOCK);
    fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);

    for (;;) {
        ssize_t len;

        relay_poll(r);
        if (r->ctrl.up && time(NULL) != last_hb) {
            last_hb = time(NULL);
            relay_ctrl_send(r, RELAY_CTRL_HEARTBEAT, &last_hb, sizeof(last_hb));
        }
        /* local producer: "<topic> <payload>" per line */
        len = read(STDIN_FILENO, line, sizeof(line) - 1);
        if (len > 0) {
            line[len] = '\0';
            relay_publish(r, (uint32_t)strtoul(line, NULL, 0), line, (uint32_t)len);
        } else if (len == 0) {
            break;
        }
        if (rdma_get_cm_event(r->ec, &ev))
            continue;
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
            const relay_sub_priv_t *priv = ev->param.conn.private_data;

            if (relay_accept_sub(r, ev) != RELAY_OK)
                rdma_reject(ev->id, NULL, 0);
            else if (r->ctrl.up)
                relay_ctrl_send(r, RELAY_CTRL_SUBSCRIBE, &priv->topic, sizeof(priv->topic));
        } else if (ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id->context != NULL) {
            relay_sub_t *sub = ev->id->context;

            rdma_ack_cm_event(ev);
            if (r->ctrl.up)
                relay_ctrl_send(r, RELAY_CTRL_UNSUBSCRIBE, &sub->topic, sizeof(sub->topic));
            relay_drop_sub(r, sub);
            continue;
        }
        rdma_ack_cm_event(ev);
    }

    rc = 0;
    while (r->subs != NULL)
        relay_drop_sub(r, r->subs);
    relay_ctrl_close(r);
out_listen:
    rdma_destroy_id(r->listen_id);
out_pool:
    if (r->ec != NULL)
        rdma_destroy_event_channel(r->ec);
    relay_pool_fini(r);
    ibv_destroy_cq(r->cq);
    ibv_dealloc_pd(r->pd);
    rdma_free_devices(devs);
    free(r);
    return rc;
}
