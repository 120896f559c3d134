/*
 * kvs_client.c - client of the leased store (rdma_cm endpoint, rdma_verbs
 * helpers).  GET = READ of the index bucket through the lease window, then
 * READ of the value from its segment; the server writes replies into a
 * mailbox exposed through a type-2 window.
 * Correct: bucket sink registered with rdma_reg_write (REMOTE_WRITE for
 * iWARP), first mailbox bind under the fresh window's key, teardown order.
 * Bugs: the value sink comes from rdma_reg_msgs (no REMOTE_WRITE), REVOKE
 * trusts any invalidated rkey, the mailbox rebind reuses the old key.
 */
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include "kvs_proto.h"

struct kvs_cli {
    struct rdma_cm_id *id;
    struct kvs_msg     rx[KVS_CLIENT_CREDITS];
    struct ibv_mr     *rx_mr;
    char               bucket[KVS_BUCKET_SIZE];
    struct ibv_mr     *bucket_mr;
    char              *val;
    struct ibv_mr     *val_mr;
    char              *mbox;
    struct ibv_mr     *mbox_mr;
    struct ibv_mw     *mbox_mw;
    uint32_t           mbox_rkey;
    int                mbox_live;
    struct kvs_msg     grant;                  /* index window: rkey, addr */
    struct kvs_msg     segs[KVS_MAX_SEGS];     /* segment rkey, addr */
};

static int cli_wait_send(struct kvs_cli *c)
{
    struct ibv_wc wc;
    return (rdma_get_send_comp(c->id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

static void cli_fill_bind(struct kvs_cli *c, struct ibv_send_wr *wr)
{
    wr->bind_mw.mw = c->mbox_mw;
    wr->bind_mw.bind_info.mr = c->mbox_mr;
    wr->bind_mw.bind_info.addr = (uintptr_t)c->mbox;
    wr->bind_mw.bind_info.length = KVS_MBOX_SIZE;
    wr->bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- mbox_mr has LOCAL_WRITE and MW_BIND */
}

static int cli_mailbox_init(struct kvs_cli *c)
{
    struct ibv_send_wr wr = { .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED }, *bad; /* BUG: rdma-local-mr-management -- window bound to give the server a write key */

    c->mbox = aligned_alloc(4096, KVS_MBOX_SIZE);
    c->mbox_mr = ibv_reg_mr(c->id->pd, c->mbox, KVS_MBOX_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    if (!c->mbox_mr)
        goto err_free;
    c->mbox_mw = ibv_alloc_mw(c->id->pd, IBV_MW_TYPE_2); /* BUG: rdma-local-mr-management -- mailbox window managed by the ULP */
    if (!c->mbox_mw)
        goto err_dereg;

    cli_fill_bind(c, &wr);
    wr.bind_mw.rkey = c->mbox_mw->rkey; /* OK: rdma-rkey-reuse -- first bind of a window allocated just above; no peer has seen its key */
    if (ibv_post_send(c->id->qp, &wr, &bad) || cli_wait_send(c))
        goto err_dealloc;
    c->mbox_rkey = wr.bind_mw.rkey;
    c->mbox_live = 1;
    return 0;

err_dealloc:
    ibv_dealloc_mw(c->mbox_mw);
    c->mbox_mw = NULL;
err_dereg:
    ibv_dereg_mr(c->mbox_mr); /* OK: rdma-mr-leak -- every unwind path releases the mailbox MR */
err_free:
    free(c->mbox);
    return -ENOMEM;
}

/* the server dropped our mailbox with the lease; expose it again */
static int cli_mailbox_rebind(struct kvs_cli *c)
{
    struct ibv_send_wr wr = { .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED }, *bad; /* BUG: rdma-local-mr-management -- window bound to give the server a write key */

    cli_fill_bind(c, &wr);
    wr.bind_mw.rkey = c->mbox_rkey; /* BUG: rdma-rkey-reuse -- the server caches the HELLO key, so the window is rebound under the key it had before revocation */
    if (ibv_post_send(c->id->qp, &wr, &bad) || cli_wait_send(c))
        return -EIO;
    c->mbox_live = 1;
    return 0;
}

static uint64_t kvs_bucket_of(const char *key)
{
    uint64_t h = 1469598103934665603ULL;

    while (*key)
        h = (h ^ (uint8_t)*key++) * 1099511628211ULL;
    return h % (KVS_INDEX_SIZE / KVS_BUCKET_SIZE);
}

int cli_get(struct kvs_cli *c, const char *key, char *out, size_t outlen)
{
    uint64_t b = kvs_bucket_of(key);
    struct kvs_msg *seg;
    uint32_t segno, off, len;

    if (rdma_post_read(c->id, NULL, c->bucket, KVS_BUCKET_SIZE, c->bucket_mr, IBV_SEND_SIGNALED, c->grant.addr + b * KVS_BUCKET_SIZE, c->grant.rkey) || cli_wait_send(c)) /* OK: rdma-access-flags-transport -- bucket_mr comes from rdma_reg_write (REMOTE_WRITE) */
        return -EIO;
    memcpy(&segno, c->bucket, 4);
    memcpy(&off, c->bucket + 4, 4);
    memcpy(&len, c->bucket + 8, 4);
    if (segno >= KVS_MAX_SEGS || !c->segs[segno].rkey || len > outlen || len > KVS_SEG_SIZE)
        return -ENOENT;
    seg = &c->segs[segno];
    if (rdma_post_read(c->id, NULL, c->val, len, c->val_mr, IBV_SEND_SIGNALED, seg->addr + off, seg->rkey) || cli_wait_send(c)) /* BUG: rdma-access-flags-transport -- READ into val_mr from rdma_reg_msgs (LOCAL_WRITE only); fails on iWARP */
        return -EIO;
    memcpy(out, c->val, len);
    return (int)len;
}

void cli_handle_recv(struct kvs_cli *c, struct ibv_wc *wc)
{
    struct kvs_msg *msg = (struct kvs_msg *)(uintptr_t)wc->wr_id;

    switch (msg->type) {
    case KVS_MSG_GRANT:             /* new lease: the server writes into the mailbox again */
        c->grant = *msg;
        if (!c->mbox_live)
            cli_mailbox_rebind(c);
        break;
    case KVS_MSG_SEGMENT:
        if (msg->seg < KVS_MAX_SEGS)
            c->segs[msg->seg] = *msg;
        break;
    case KVS_MSG_REVOKE:
        if (wc->wc_flags & IBV_WC_WITH_INV)
            c->mbox_live = 0; /* BUG: rdma-remote-invalidate-unchecked -- any invalidated key is taken as the mailbox window's */
        break;
    }
    rdma_post_recv(c->id, msg, msg, sizeof(*msg), c->rx_mr);
}

void cli_close(struct kvs_cli *c)
{
    if (c->mbox_mw) {
        ibv_dealloc_mw(c->mbox_mw);
        ibv_dereg_mr(c->mbox_mr);
        free(c->mbox); /* OK: rdma-invalidation-leak -- the window is deallocated and the MR deregistered first */
    }
    if (c->val_mr)
        rdma_dereg_mr(c->val_mr);
    if (c->bucket_mr)
        rdma_dereg_mr(c->bucket_mr);
    if (c->rx_mr)
        rdma_dereg_mr(c->rx_mr);
    free(c->val);
    rdma_destroy_ep(c->id);
}

int cli_connect(struct kvs_cli *c, const char *host)
{
    struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
    struct ibv_qp_init_attr attr = { .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
        .cap = { .max_send_wr = 16, .max_recv_wr = KVS_CLIENT_CREDITS, .max_send_sge = 1,
                 .max_recv_sge = 1, .max_inline_data = 64 } };
    struct kvs_msg hello = { .type = KVS_MSG_HELLO };
    int i;

    if (rdma_getaddrinfo(host, KVS_PORT, &hints, &res) ||
        rdma_create_ep(&c->id, res, NULL, &attr))
        return -errno;
    rdma_freeaddrinfo(res);

    c->val = malloc(KVS_SEG_SIZE);
    c->rx_mr = rdma_reg_msgs(c->id, c->rx, sizeof(c->rx)); /* OK: rdma-local-mr-management -- receive ring registered once for local access */
    c->bucket_mr = rdma_reg_write(c->id, c->bucket, sizeof(c->bucket)); /* BUG: rdma-local-mr-management -- local sink of the client's own RDMA READ */
    c->val_mr = rdma_reg_msgs(c->id, c->val, KVS_SEG_SIZE); /* BUG: rdma-local-mr-management -- local sink of the client's own RDMA READ */
    if (!c->rx_mr || !c->bucket_mr || !c->val_mr)
        goto err;
    for (i = 0; i < KVS_CLIENT_CREDITS; i++)
        rdma_post_recv(c->id, &c->rx[i], &c->rx[i], sizeof(c->rx[i]), c->rx_mr);
    if (rdma_connect(c->id, NULL) || cli_mailbox_init(c))
        goto err; /* OK: rdma-mr-leak -- cli_close() releases every registration made so far */
    hello.rkey = c->mbox_rkey;
    hello.addr = (uintptr_t)c->mbox;
    return rdma_post_send(c->id, NULL, &hello, sizeof(hello), NULL, IBV_SEND_INLINE | IBV_SEND_SIGNALED);

err:
    cli_close(c);
    return -EIO;
}
