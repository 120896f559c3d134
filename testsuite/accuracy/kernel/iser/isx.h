/* SPDX-License-Identifier: GPL-2.0 */
/*
 * isx: an iSER-initiator-style ULP (drivers/infiniband/ulp/iser shape:
 * iser_verbs.c, iser_memory.c, iser_initiator.c), written fresh for the
 * accuracy corpus. Shared declarations.
 */
#ifndef _ISX_H
#define _ISX_H

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define ISX_WRS_PER_CMD		3	/* LOCAL_INV + REG_MR + SEND */
#define ISX_MAX_TX_MISC_PDUS	6
#define ISX_MAX_RX_MISC_PDUS	4
#define ISX_SIGNAL_CMD_COUNT	32
#define ISX_RSV			0x04
#define ISX_WSV			0x08

enum isx_data_dir {
	ISX_DIR_IN = 0,
	ISX_DIR_OUT = 1,
};

struct isx_device {
	struct ib_device	*ib_device;
	struct ib_pd		*pd;
};

struct isx_fr_desc {
	struct list_head	list;
	struct ib_mr		*mr;
	bool			mr_valid;
};

struct isx_mem_reg {
	struct ib_sge		sge;
	u32			rkey;
	struct isx_fr_desc	*desc;
};

struct isx_tx_desc {
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_sge		tx_sg;
	struct ib_cqe		cqe;
	u64			dma_addr;
};

struct isx_conn {
	struct rdma_cm_id	*cma_id;
	struct isx_device	*device;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			cq_size;
	u32			cmds_max;
	u8			sig_count;
	struct ib_cqe		reg_cqe;
	spinlock_t		lock;
	struct list_head	fr_list;
	u32			max_pages;
};

struct isx_task {
	struct isx_conn		*conn;
	struct isx_tx_desc	desc;
	struct isx_mem_reg	rdma_reg[2];
	struct scatterlist	*sg[2];
	int			dma_nents[2];
	int			dir[2];
};

struct isx_hdr {
	u8	flags;
	u32	itt;
	u32	read_stag;
	u32	write_stag;
};

/* iser_verbs.c */
int isx_create_device(struct isx_device *device, struct ib_device *ibdev);
int isx_create_ib_conn_res(struct isx_conn *conn);
struct isx_fr_desc *isx_reg_desc_get(struct isx_conn *conn);
void isx_reg_desc_put(struct isx_conn *conn, struct isx_fr_desc *desc);

/* iser_memory.c */
int isx_reg_rdma_mem(struct isx_task *task, enum isx_data_dir dir);
void isx_unreg_mem(struct isx_task *task, enum isx_data_dir dir);
int isx_inv_desc(struct isx_fr_desc *desc, u32 rkey);

struct isx_rx_desc {
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	u64			dma;
	struct isx_hdr		*hdr;
	struct isx_conn		*conn;
};

/* iser_initiator.c */
void isx_task_rsp(struct isx_conn *conn, struct isx_hdr *hdr, u32 len);
struct isx_task *isx_itt_to_task(struct isx_conn *conn, u32 itt);

#endif /* _ISX_H */
