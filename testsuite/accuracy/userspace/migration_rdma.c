/*
 * RDMA live-migration transport: RAM registration and page transfer.
 *
 * The source RDMA-WRITEs dirty RAM into the destination.  In pin-all mode
 * the destination registers every RAM block up front and ships all rkeys in
 * one control message; otherwise the source asks for each 1 MiB chunk with
 * a REGISTER request and the destination registers that chunk on first use
 * and answers with REGISTER_RESULT.  When the kernel cannot pin (ENOTSUP)
 * the destination falls back to on-demand paging.  The source registers its
 * own chunks for local access only.  Every RDMA WRITE is signaled; at most
 * RDMA_SIGNALED_SEND_MAX are in flight.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define RDMA_REG_CHUNK_SHIFT        20
#define RDMA_REG_CHUNK_SIZE         (1UL << RDMA_REG_CHUNK_SHIFT)
#define RDMA_CONTROL_MAX_BUFFER     (512 * 1024)
#define RDMA_SIGNALED_SEND_MAX      512
#define RDMA_MERGE_MAX_SGE          16
#define RDMA_WRID_RDMA_WRITE        1
#define RDMA_WRID_SEND_CONTROL      2000
#define RDMA_WRID_RECV_CONTROL      4000

enum { RDMA_WRID_READY = 0, RDMA_WRID_DATA, RDMA_WRID_CONTROL, RDMA_WRID_MAX };

typedef struct RDMALocalBlock {
    char            *local_host_addr;
    uint64_t         remote_host_addr;
    uint64_t         length;
    int              index;
    int              nb_chunks;
    struct ibv_mr   *mr;            /* pin-all: the whole block */
    struct ibv_mr  **pmr;           /* chunk registrations */
    uint32_t        *remote_keys;
} RDMALocalBlock;

typedef struct RDMAWorkRequestData {
    uint8_t          control[RDMA_CONTROL_MAX_BUFFER];
    struct ibv_mr   *control_mr;
    size_t           control_len;
} RDMAWorkRequestData;

typedef struct RDMAUnalignedWrite {
    struct ibv_mr   *mr;
    uint64_t         len;
} RDMAUnalignedWrite;

typedef struct RDMAContext {
    struct rdma_cm_id   *cm_id;
    struct ibv_context  *verbs;
    struct ibv_pd       *pd;
    struct ibv_cq       *cq;
    struct ibv_qp       *qp;
    RDMAWorkRequestData  wr_data[RDMA_WRID_MAX];
    RDMALocalBlock      *blocks;
    int                  nb_blocks;
    bool                 pin_all;
    int                  nb_sent;
    int                  total_registrations;
    struct ibv_mr       *odp_mr;    /* implicit ODP on the destination */
} RDMAContext;

void error_report(const char *fmt, ...);
int qemu_rdma_post_recv_control(RDMAContext *rdma, int idx);
int qemu_rdma_block_for_wrid(RDMAContext *rdma, uint64_t wrid);

static int qemu_rdma_alloc_qp(RDMAContext *rdma)
{
    struct ibv_qp_init_attr attr = { 0 };

    attr.cap.max_send_wr = RDMA_SIGNALED_SEND_MAX;  /* OK: rdma-send-queue-undersized -- one WRITE per chunk, bounded by nb_sent */
    attr.cap.max_recv_wr = 3;
    attr.cap.max_send_sge = RDMA_MERGE_MAX_SGE;     // BUG: rdma-queue-cap-unchecked -- 16 gather entries requested without comparing with max_sge
    attr.cap.max_recv_sge = 1;
    attr.send_cq = rdma->cq;
    attr.recv_cq = rdma->cq;
    attr.qp_type = IBV_QPT_RC;
    /* OK: rdma-unsignaled-send-starvation -- writes and control sends are all signaled */
    attr.sq_sig_all = 0;

    if (rdma_create_qp(rdma->cm_id, rdma->pd, &attr) < 0)
        return -1;
    rdma->qp = rdma->cm_id->qp;
    return 0;
}

static int qemu_rdma_reg_control_all(RDMAContext *rdma)
{
    int idx;

    for (idx = 0; idx < RDMA_WRID_MAX; idx++) {
        RDMAWorkRequestData *wr = &rdma->wr_data[idx];

        /* OK: rdma-local-mr-management -- control buffers are only sent and received, registered once */
        wr->control_mr = ibv_reg_mr(rdma->pd, wr->control, RDMA_CONTROL_MAX_BUFFER, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-remote-access-overbroad -- remote write on control buffers whose rkey nobody is told
        if (!wr->control_mr)
            goto unwind;
        rdma->total_registrations++;
        if (idx == RDMA_WRID_READY && qemu_rdma_post_recv_control(rdma, idx))
            goto unwind;    // BUG: rdma-mr-leak -- the unwind loop stops below idx: this iteration's control_mr is never deregistered
    }
    return 0;

unwind:
    while (idx--) {
        ibv_dereg_mr(rdma->wr_data[idx].control_mr);
        rdma->wr_data[idx].control_mr = NULL;
    }
    error_report("qemu_rdma_reg_control_all failed: %s", strerror(errno));
    return -1;
}

static int qemu_rdma_reg_whole_ram_blocks(RDMAContext *rdma)
{
    int i;

    for (i = 0; i < rdma->nb_blocks; i++) {
        RDMALocalBlock *block = &rdma->blocks[i];
        int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

        // BUG: rdma-local-mr-management -- the block's rkey is sent to the source for its RDMA WRITEs
        block->mr = ibv_reg_mr(rdma->pd, block->local_host_addr, block->length, access);
        if (!block->mr && errno == ENOTSUP) {
            access |= IBV_ACCESS_ON_DEMAND;
            /* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- the ODP retry keeps LOCAL_WRITE; one block, not the address space */
            block->mr = ibv_reg_mr(rdma->pd, block->local_host_addr, block->length, access); // BUG: rdma-local-mr-management -- same exposed block, on-demand paging
        }
        if (!block->mr) {
            error_report("Failed to register local dest ram block!");
            break;
        }
        rdma->total_registrations++;
    }
    if (i >= rdma->nb_blocks)
        return 0;

    /* OK: rdma-mr-leak -- unwinds every block registered before the failing one */
    for (i--; i >= 0; i--) {
        ibv_dereg_mr(rdma->blocks[i].mr);
        rdma->blocks[i].mr = NULL;
        rdma->total_registrations--;
    }
    return -1;
}

static int qemu_rdma_reg_implicit_odp(RDMAContext *rdma)
{
    struct ibv_device_attr_ex attr;

    if (ibv_query_device_ex(rdma->verbs, NULL, &attr) ||
        !(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT))
        return -ENOTSUP;
    // BUG: rdma-local-mr-management -- the key is advertised to the source as the rkey of every block
    rdma->odp_mr = ibv_reg_mr(rdma->pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-remote-access-overbroad -- implicit ODP MR grants the source remote write to the whole address space
    return rdma->odp_mr ? 0 : -errno;
}

int qemu_rdma_dest_init(RDMAContext *rdma)
{
    if (qemu_rdma_alloc_qp(rdma) || qemu_rdma_reg_control_all(rdma))
        return -1;
    if (!rdma->pin_all)
        return 0;
    if (qemu_rdma_reg_implicit_odp(rdma) == 0)
        return 0;
    return qemu_rdma_reg_whole_ram_blocks(rdma);
}

/* destination: handle one REGISTER request, answered by REGISTER_RESULT */
static int qemu_rdma_register_and_get_keys(RDMAContext *rdma, RDMALocalBlock *block,
                                           uint64_t chunk, uint32_t *rkey)
{
    char *chunk_start = block->local_host_addr + (chunk << RDMA_REG_CHUNK_SHIFT);
    uint64_t len = RDMA_REG_CHUNK_SIZE;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

    if (rdma->odp_mr || block->mr) {
        *rkey = rdma->odp_mr ? rdma->odp_mr->rkey : block->mr->rkey;
        return 0;
    }
    if (chunk_start + len > block->local_host_addr + block->length)
        len = block->local_host_addr + block->length - chunk_start;

    if (!block->pmr[chunk]) {
        /* OK: rdma-registration-in-datapath -- a chunk is registered on first use and kept */
        block->pmr[chunk] = ibv_reg_mr(rdma->pd, chunk_start, len, access); // BUG: rdma-local-mr-management -- chunk registered by hand so that its rkey can go to the source
        if (!block->pmr[chunk] && errno == ENOTSUP) {
            access = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_WRITE;
            block->pmr[chunk] = ibv_reg_mr(rdma->pd, chunk_start, len, access); // BUG: rdma-access-flags-invalid, rdma-local-mr-management -- the ODP retry drops LOCAL_WRITE while asking for REMOTE_WRITE; chunk exposed by hand
        }
        if (!block->pmr[chunk])
            return -1;
        rdma->total_registrations++;
    }
    *rkey = block->pmr[chunk]->rkey;
    return 0;
}

int qemu_rdma_reply_register(RDMAContext *rdma, int block_index, uint64_t chunk)
{
    RDMAWorkRequestData *wr = &rdma->wr_data[RDMA_WRID_CONTROL];
    struct ibv_sge sge;
    struct ibv_send_wr send_wr = { 0 }, *bad;
    uint32_t rkey;

    if (qemu_rdma_register_and_get_keys(rdma, &rdma->blocks[block_index], chunk, &rkey))
        return -1;
    memcpy(wr->control, &rkey, sizeof(rkey));
    sge.addr = (uintptr_t)wr->control;
    sge.length = sizeof(rkey);
    sge.lkey = wr->control_mr->lkey;
    send_wr.wr_id = RDMA_WRID_SEND_CONTROL;
    send_wr.opcode = IBV_WR_SEND;
    send_wr.send_flags = IBV_SEND_SIGNALED;
    send_wr.sg_list = &sge;
    send_wr.num_sge = 1;
    return ibv_post_send(rdma->qp, &send_wr, &bad);
}

static void qemu_rdma_unaligned_done(RDMAUnalignedWrite *uw)
{
    ibv_dereg_mr(uw->mr);   // BUG: rdma-registration-in-datapath -- a per-write MR deregistered from the write and completion paths
    free(uw);
}

/* source: write one chunk (or the tail of a block) to the destination */
int qemu_rdma_write_one(RDMAContext *rdma, int current_index, uint64_t current_addr,
                        uint64_t length, uint32_t remote_rkey)
{
    RDMALocalBlock *block = &rdma->blocks[current_index];
    uint64_t chunk = (current_addr - (uintptr_t)block->local_host_addr) >> RDMA_REG_CHUNK_SHIFT;
    char *chunk_end = block->local_host_addr + ((chunk + 1) << RDMA_REG_CHUNK_SHIFT);
    struct ibv_sge sge = { .addr = current_addr, .length = (uint32_t)length };
    struct ibv_send_wr send_wr = { 0 }, *bad;
    RDMAUnalignedWrite *uw = NULL;

    while (rdma->nb_sent >= RDMA_SIGNALED_SEND_MAX)
        qemu_rdma_block_for_wrid(rdma, RDMA_WRID_RDMA_WRITE);

    if ((char *)(uintptr_t)(current_addr + length) > chunk_end) {
        /* the write straddles two chunks: register exactly this range */
        uw = calloc(1, sizeof(*uw));
        if (!uw)
            return -ENOMEM;
        // BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a registration for every straddling write
        uw->mr = ibv_reg_mr(rdma->pd, (void *)(uintptr_t)current_addr, length, 0);
        if (!uw->mr) {
            free(uw);
            return -errno;
        }
        uw->len = length;
        sge.lkey = uw->mr->lkey;
    } else if (rdma->pin_all) {
        sge.lkey = block->mr->lkey;
    } else {
        if (!block->pmr[chunk]) {
            /* OK: rdma-registration-in-datapath -- registered the first time the chunk is sent, then kept */
            block->pmr[chunk] = ibv_reg_mr(rdma->pd, block->local_host_addr + (chunk << RDMA_REG_CHUNK_SHIFT), RDMA_REG_CHUNK_SIZE, 0); // BUG: rdma-local-mr-management -- local side of the transport's own RDMA WRITE
            if (!block->pmr[chunk])
                return -errno;
        }
        sge.lkey = block->pmr[chunk]->lkey;
    }

    send_wr.wr_id = uw ? (uintptr_t)uw : RDMA_WRID_RDMA_WRITE;
    send_wr.opcode = IBV_WR_RDMA_WRITE;
    send_wr.send_flags = IBV_SEND_SIGNALED;
    send_wr.sg_list = &sge;
    send_wr.num_sge = 1;
    send_wr.wr.rdma.rkey = remote_rkey;
    send_wr.wr.rdma.remote_addr = block->remote_host_addr +
                                  (current_addr - (uintptr_t)block->local_host_addr);
    if (ibv_post_send(rdma->qp, &send_wr, &bad)) {
        if (uw)
            qemu_rdma_unaligned_done(uw);   /* OK: rdma-mr-leak -- the per-write MR is released when the post fails */
        return -EIO;
    }
    rdma->nb_sent++;
    return 0;
}

int qemu_rdma_poll(RDMAContext *rdma, uint64_t *wr_id_out)
{
    struct ibv_wc wc;
    int ret = ibv_poll_cq(rdma->cq, 1, &wc);

    if (ret <= 0)
        return ret;
    if (wc.status != IBV_WC_SUCCESS) {
        error_report("ibv_poll_cq wc.status=%d %s!", wc.status, ibv_wc_status_str(wc.status));
        return -1;
    }
    if (wc.opcode == IBV_WC_RDMA_WRITE) {
        if (wc.wr_id != RDMA_WRID_RDMA_WRITE) {
            qemu_rdma_unaligned_done((RDMAUnalignedWrite *)(uintptr_t)wc.wr_id);
        }
        rdma->nb_sent--;
    }
    *wr_id_out = wc.wr_id;
    return 1;
}

/* RAM block removed (hot-unplug): drop its registrations and compact the table */
void qemu_rdma_delete_block(RDMAContext *rdma, RDMALocalBlock *block)
{
    RDMALocalBlock *last = &rdma->blocks[rdma->nb_blocks - 1];
    int j;

    if (block->pmr) {
        /* OK: rdma-mr-leak -- every chunk registration is released with the table */
        for (j = 0; j < block->nb_chunks; j++) {
            if (!block->pmr[j])
                continue;
            ibv_dereg_mr(block->pmr[j]);
            rdma->total_registrations--;
        }
        free(block->pmr);
        block->pmr = NULL;
    }
    free(block->remote_keys);
    if (block != last)
        *block = *last;     // BUG: rdma-mr-leak -- overwrites block->mr, the pin-all registration of the removed block, without deregistering it
    rdma->nb_blocks--;
}

void qemu_rdma_cleanup(RDMAContext *rdma)
{
    int idx;

    if (rdma->qp)
        rdma_destroy_qp(rdma->cm_id);
    for (idx = 0; idx < RDMA_WRID_MAX; idx++) {
        if (rdma->wr_data[idx].control_mr)
            ibv_dereg_mr(rdma->wr_data[idx].control_mr);
        rdma->wr_data[idx].control_mr = NULL;
    }
    if (rdma->odp_mr)
        ibv_dereg_mr(rdma->odp_mr);
    rdma->odp_mr = NULL;
    while (rdma->nb_blocks)
        qemu_rdma_delete_block(rdma, &rdma->blocks[0]);
}
