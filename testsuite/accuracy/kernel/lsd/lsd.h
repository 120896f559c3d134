/* SPDX-License-Identifier: GPL-2.0 */
/*
 * lsd: an invented log-shipping daemon's kernel transport, split into
 * connection setup (lsd_conn.c) and shipping (lsd_ship.c), written fresh for
 * the accuracy corpus.
 */
#ifndef _LSD_H
#define _LSD_H

#include <linux/kernel.h>
#include <linux/slab.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define LSD_INLINE_HDR	512
#define LSD_NR_ACKS	8

struct lsd_ack;

struct lsd_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	u32			depth;
	u64			peer_log_addr;
	u32			peer_log_rkey;
	u64			tail;
	u32			credits;
	struct lsd_ack		*acks;
	u64			acks_dma;
};

struct lsd_ack {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	struct lsd_conn		*conn;
	__be32			acked;
};

struct lsd_rec {
	struct ib_rdma_wr	write_wr;
	struct ib_send_wr	hdr_wr;
	struct ib_sge		body_sge;
	struct ib_sge		hdr_sge;
	void			*hdr;
	u32			hdr_len;
	u64			body_dma;
	u32			body_len;
};

#endif /* _LSD_H */
