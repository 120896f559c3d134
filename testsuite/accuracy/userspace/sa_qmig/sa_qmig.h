/*
 * sa_qmig.h - RDMA live-migration channel (QEMU migration/rdma.c style).
 *
 * The source RDMA-WRITEs guest RAM into the destination.  Two modes:
 *  - pin-all: the destination registers every RAM block once
 *    (LOCAL_WRITE | REMOTE_WRITE, ODP fallback on ENOTSUP) and sends all
 *    block rkeys in RDMA_CONTROL_RAM_BLOCKS_RESULT;
 *  - per chunk: the source asks for each 1 MiB chunk with
 *    RDMA_CONTROL_REGISTER_REQUEST, the destination registers it and
 *    answers with the rkey; once the source is done with a chunk it sends
 *    RDMA_CONTROL_UNREGISTER_REQUEST and both sides deregister it.
 * The destination also exposes a dirty-bitmap buffer whose key travels in
 * the capabilities carried by rdma_accept() private data.  Source-side
 * registrations are local only (access 0 / LOCAL_WRITE).
 *
 * sa_qmig_src.c: control channel helpers (shared), source side.
 * sa_qmig_dest.c: destination side.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked, rdma-remote-invalidate-unchecked -- migration channel reviewed for MR lifetime and key exposure only
 */
#ifndef SA_QMIG_H
#define SA_QMIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define RDMA_REG_CHUNK_SHIFT	20
#define RDMA_REG_CHUNK_SIZE	(1UL << RDMA_REG_CHUNK_SHIFT)
#define RDMA_CONTROL_MAX_BUFFER	(512 * 1024)
#define RDMA_WRID_MAX		3	/* send control, recv control, ready */
#define RDMA_WRID_RDMA_WRITE	0x100
#define RDMA_UNREG_QUEUE	64
#define RDMA_BITMAP_MAX		(64UL << 20)

enum {
	RDMA_CONTROL_NONE = 0,
	RDMA_CONTROL_READY,
	RDMA_CONTROL_RAM_BLOCKS_REQUEST,
	RDMA_CONTROL_RAM_BLOCKS_RESULT,
	RDMA_CONTROL_REGISTER_REQUEST,
	RDMA_CONTROL_REGISTER_RESULT,
	RDMA_CONTROL_UNREGISTER_REQUEST,
	RDMA_CONTROL_UNREGISTER_FINISHED,
};

typedef struct {
	uint32_t len;
	uint32_t type;
	uint32_t repeat;
	uint32_t padding;
} RDMAControlHeader;

typedef struct {
	uint64_t current_addr;
	uint32_t current_index;
	uint32_t chunks;
} RDMARegister;

typedef struct {
	uint32_t rkey;
	uint32_t padding;
	uint64_t host_addr;
} RDMARegisterResult;

typedef struct {
	uint64_t remote_host_addr;
	uint64_t offset;
	uint64_t length;
	uint32_t remote_rkey;
	uint32_t padding;
} RDMADestBlock;

typedef struct {
	uint32_t version;
	uint32_t flags;
	uint64_t bitmap_addr;
	uint32_t bitmap_rkey;
	uint32_t padding;
} RDMACapabilities;

typedef struct RDMALocalBlock {
	char		*block_name;
	uint8_t		*local_host_addr;
	uint64_t	 remote_host_addr;
	uint64_t	 offset;
	uint64_t	 length;
	struct ibv_mr	**pmr;		/* per-chunk registrations */
	struct ibv_mr	*mr;		/* pin-all registration */
	uint32_t	*remote_keys;	/* source: dest rkey per chunk */
	uint32_t	 remote_rkey;	/* source: dest rkey, pin-all */
	int		 index;
	int		 nb_chunks;
} RDMALocalBlock;

typedef struct {
	int		 nb_blocks;
	RDMALocalBlock	*block;
} RDMALocalBlocks;

typedef struct {
	uint8_t		*control;
	struct ibv_mr	*control_mr;
	size_t		 control_len;
} RDMAWorkRequestData;

typedef struct RDMAContext {
	struct rdma_event_channel *channel;
	struct rdma_cm_id	*cm_id;
	struct rdma_cm_id	*listen_id;
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	RDMAWorkRequestData	 wr_data[RDMA_WRID_MAX];
	RDMALocalBlocks		 local_ram_blocks;
	bool			 pin_all;
	int			 error_state;

	/* destination: buffer the source writes its dirty bitmap into */
	void			*bitmap_buf;
	size_t			 bitmap_len;
	struct ibv_mr		*bitmap_mr;

	/* source: local staging for the bitmap and compressed pages */
	void			*stage_buf;
	struct ibv_mr		*stage_mr;

	/* source: chunks whose RDMA WRITE completed, to be unregistered */
	uint64_t		 unreg[RDMA_UNREG_QUEUE];
	int			 unreg_head, unreg_tail;
} RDMAContext;

#define RDMA_UNREG_ENCODE(blk, chunk)	(((uint64_t)(blk) << 32) | (uint32_t)(chunk))
#define RDMA_UNREG_BLOCK(v)		((int)((v) >> 32))
#define RDMA_UNREG_CHUNK(v)		((int)((v) & 0xffffffffu))

static inline uint8_t *ram_chunk_start(const RDMALocalBlock *b, int chunk)
{
	return b->local_host_addr + ((uint64_t)chunk << RDMA_REG_CHUNK_SHIFT);
}

static inline uint8_t *ram_chunk_end(const RDMALocalBlock *b, int chunk)
{
	uint8_t *end = ram_chunk_start(b, chunk) + RDMA_REG_CHUNK_SIZE;
	uint8_t *lim = b->local_host_addr + b->length;

	return end > lim ? lim : end;
}

/* sa_qmig_src.c: shared control channel */
int qemu_rdma_init_control(RDMAContext *rdma);
void qemu_rdma_free_control(RDMAContext *rdma);
int qemu_rdma_poll_wrid(RDMAContext *rdma, uint64_t wrid);
int qemu_rdma_post_send_control(RDMAContext *rdma, const void *payload,
				RDMAControlHeader *head);
int qemu_rdma_wait_control(RDMAContext *rdma, uint32_t type,
			   void **payload, uint32_t *len);

/* sa_qmig_dest.c */
int qemu_rdma_dest_accept(RDMAContext *rdma);
int qemu_rdma_dest_handle_control(RDMAContext *rdma);
void qemu_rdma_dest_cleanup(RDMAContext *rdma);

#endif
