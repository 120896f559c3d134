/*
 * ua_nvmf_tgt_srq.c - NVMe-oF-style block target over rdma_cm with an SRQ.
 *
 * Command capsules arrive on a shared receive queue.  Every queue pair owns
 * max_queue_depth requests, each with a staging buffer registered at
 * connection time.  Host writes are pulled with RDMA READ into the staging
 * buffer (or, for I/O larger than a staging unit, into a buffer allocated and
 * registered for that I/O); host reads are pushed with a chain of RDMA WRITEs
 * (one per keyed SGL descriptor) followed by the response SEND, which is a
 * SEND_WITH_INV of the host's key when the host asks for it and the device
 * has the memory-management extensions.  iWARP devices get REMOTE_WRITE on
 * READ sinks.
 *
 * Correct: queue-pair SGE count clamped to the device, capsule ring
 * registered once, per-I/O big buffers carry REMOTE_WRITE for iWARP READs,
 * teardown of the request table.
 * Not correct: the staging flags are chosen by an inline transport test that
 * also drops LOCAL_WRITE on iWARP, the admin buffer used as a READ sink has
 * no REMOTE_WRITE, big buffers are registered per I/O, a WRITE chain of up to
 * four descriptors plus the response does not fit the 2-per-request send
 * queue, the inline size is never checked, and one unwind path leaks an MR.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define TGT_SRQ_DEPTH		1024
#define TGT_IO_UNIT		(128 * 1024)
#define TGT_MAX_SGL		4
#define TGT_TX_SGE		16
#define TGT_INLINE_SIZE		256
#define TGT_ADMIN_BUF		4096
#define TGT_MD_SIZE		512
#define TGT_CMD_F_INVALIDATE	0x1

#define tgt_min(a, b)		((a) < (b) ? (a) : (b))

enum { TGT_OPC_WRITE = 1, TGT_OPC_READ = 2, TGT_OPC_SET_FEATURES = 9 };

struct tgt_sgl { uint64_t addr; uint32_t len; uint32_t key; };

struct tgt_cmd {
	uint8_t		opc;
	uint8_t		flags;
	uint16_t	cid;
	uint8_t		nsgl;
	uint8_t		rsvd[3];
	uint64_t	slba;
	struct tgt_sgl	sgl[TGT_MAX_SGL];
};

struct tgt_rsp { uint16_t cid; uint16_t status; uint32_t rsvd; };

struct tgt_recv {
	struct ibv_recv_wr	wr;
	struct ibv_sge		sge;
	struct tgt_cmd		*cmd;
};

struct tgt_device {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_srq		*srq;
	struct ibv_device_attr	attr;
	int			send_inv_ok;
	struct tgt_cmd		*cmds;
	struct ibv_mr		*cmds_mr;
	struct tgt_recv		recvs[TGT_SRQ_DEPTH];
	void			*admin_buf;
	struct ibv_mr		*admin_mr;
	char			*ramdisk;
};

struct tgt_qpair;

struct tgt_req {
	struct tgt_req		*next;
	struct tgt_qpair	*qpair;
	struct tgt_recv		*recv;
	void			*staging;
	struct ibv_mr		*staging_mr;
	void			*big;
	struct ibv_mr		*big_mr;
	void			*md;
	int			nwr;
	struct ibv_send_wr	data_wr[TGT_MAX_SGL];
	struct ibv_sge		data_sge[TGT_MAX_SGL];
	struct ibv_send_wr	rsp_wr;
	struct ibv_sge		rsp_sge;
	struct tgt_rsp		rsp;
};

struct tgt_qpair {
	struct rdma_cm_id	*cm_id;
	struct ibv_qp		*qp;
	struct tgt_device	*dev;
	uint16_t		max_queue_depth;
	struct tgt_req		*reqs;
	struct tgt_req		*free_reqs;
};

static int tgt_post_srq_recv(struct tgt_device *dev, struct tgt_recv *recv)
{
	struct ibv_recv_wr *bad;

	return ibv_post_srq_recv(dev->srq, &recv->wr, &bad);
}

int tgt_device_init(struct tgt_device *dev, struct ibv_context *ctx)
{
	struct ibv_srq_init_attr srq_attr = { .attr = { .max_wr = TGT_SRQ_DEPTH, .max_sge = 1 } };
	int i;

	memset(dev, 0, sizeof(*dev));
	dev->ctx = ctx;
	if (ibv_query_device(ctx, &dev->attr))
		return -errno;
	dev->send_inv_ok = !!(dev->attr.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS);
	dev->pd = ibv_alloc_pd(ctx);
	dev->cq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
	if (!dev->pd || !dev->cq)
		return -ENOMEM;
	dev->srq = ibv_create_srq(dev->pd, &srq_attr);
	if (!dev->srq)
		return -errno;

	dev->cmds = calloc(TGT_SRQ_DEPTH, sizeof(*dev->cmds));
	dev->cmds_mr = ibv_reg_mr(dev->pd, dev->cmds, TGT_SRQ_DEPTH * sizeof(*dev->cmds), IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- capsule ring registered once for local access */
	if (!dev->cmds_mr)
		return -errno;
	dev->admin_buf = aligned_alloc(4096, TGT_ADMIN_BUF);
	dev->admin_mr = ibv_reg_mr(dev->pd, dev->admin_buf, TGT_ADMIN_BUF, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- local sink of the target's own RDMA READ */
	if (!dev->admin_mr)
		goto err_cmds;

	for (i = 0; i < TGT_SRQ_DEPTH; i++) {
		struct tgt_recv *recv = &dev->recvs[i];

		recv->cmd = &dev->cmds[i];
		recv->sge.addr = (uintptr_t)recv->cmd;
		recv->sge.length = sizeof(*recv->cmd);
		recv->sge.lkey = dev->cmds_mr->lkey;
		recv->wr.wr_id = (uintptr_t)recv;
		recv->wr.sg_list = &recv->sge;
		recv->wr.num_sge = 1;
		if (tgt_post_srq_recv(dev, recv))
			goto err_admin; /* OK: rdma-mr-leak -- both MRs are released on the unwind path */
	}
	return 0;

err_admin:
	ibv_dereg_mr(dev->admin_mr);
err_cmds:
	ibv_dereg_mr(dev->cmds_mr);
	return -EIO;
}

static int tgt_qpair_alloc_reqs(struct tgt_qpair *qpair)
{
	struct tgt_device *dev = qpair->dev;
	struct tgt_req *r;
	int access, i, j;

	qpair->reqs = calloc(qpair->max_queue_depth, sizeof(*qpair->reqs));
	if (!qpair->reqs)
		return -ENOMEM;

	access = IBV_ACCESS_LOCAL_WRITE;
	if (dev->ctx->device->transport_type == IBV_TRANSPORT_IWARP)
		access = IBV_ACCESS_REMOTE_WRITE;	/* iWARP READ sinks */

	for (i = 0; i < qpair->max_queue_depth; i++) {
		r = &qpair->reqs[i];
		r->qpair = qpair;
		r->staging = aligned_alloc(4096, TGT_IO_UNIT);
		if (!r->staging)
			goto unwind;
		/* BUG: rdma-local-mr-management -- local side of the target's RDMA READ/WRITE */
		r->staging_mr = ibv_reg_mr(dev->pd, r->staging, TGT_IO_UNIT, access); /* BUG: rdma-access-flags-invalid, rdma-access-flags-transport -- flags chosen by an inline iWARP test, and on iWARP '=' drops LOCAL_WRITE so REMOTE_WRITE goes alone */
		if (!r->staging_mr) {
			free(r->staging);
			goto unwind;
		}
		r->md = calloc(1, TGT_MD_SIZE);
		if (!r->md)
			goto unwind; /* BUG: rdma-mr-leak -- the unwind loop stops below i; reqs[i].staging_mr stays registered */
		r->next = qpair->free_reqs;
		qpair->free_reqs = r;
	}
	return 0;

unwind:
	for (j = 0; j < i; j++) {
		ibv_dereg_mr(qpair->reqs[j].staging_mr);
		free(qpair->reqs[j].staging);
		free(qpair->reqs[j].md);
	}
	free(qpair->reqs);
	qpair->reqs = NULL;
	return -ENOMEM;
}

int tgt_qpair_create(struct tgt_device *dev, struct tgt_qpair *qpair,
		     struct rdma_cm_id *cm_id, uint16_t queue_depth)
{
	struct ibv_qp_init_attr attr;
	int ret;

	qpair->dev = dev;
	qpair->cm_id = cm_id;
	qpair->max_queue_depth = queue_depth;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = dev->cq;
	attr.recv_cq = dev->cq;
	attr.srq = dev->srq;
	attr.sq_sig_all = 0;
	/* SEND, READ and WRITE operations */
	/* OK: rdma-send-queue-manual-factor -- the factor covers data WRs only; this file posts no registration or invalidation */
	attr.cap.max_send_wr = (uint32_t)qpair->max_queue_depth * 2; /* BUG(file): rdma-send-queue-undersized -- a host read posts up to TGT_MAX_SGL (4) WRITEs plus the response SEND in one chain */
	attr.cap.max_send_sge = tgt_min((uint32_t)dev->attr.max_sge, TGT_TX_SGE); /* OK: rdma-queue-cap-unchecked -- 16 is clamped to the device's max_sge */
	attr.cap.max_inline_data = TGT_INLINE_SIZE; /* BUG(file): rdma-queue-cap-unchecked -- 256 bytes of inline data requested without checking what the device grants */
	ret = rdma_create_qp(cm_id, dev->pd, &attr);
	if (ret)
		return -errno;
	qpair->qp = cm_id->qp;

	ret = tgt_qpair_alloc_reqs(qpair);
	if (ret) {
		rdma_destroy_qp(cm_id);
		return ret;
	}
	return 0;
}

void tgt_qpair_destroy(struct tgt_qpair *qpair)
{
	int i;

	rdma_destroy_qp(qpair->cm_id);
	for (i = 0; i < qpair->max_queue_depth; i++) {
		ibv_dereg_mr(qpair->reqs[i].staging_mr); /* OK: rdma-mr-leak -- every staging MR of the table is released */
		free(qpair->reqs[i].staging);
		free(qpair->reqs[i].md);
	}
	free(qpair->reqs);
}

static void tgt_req_build_rsp(struct tgt_req *r, uint16_t status)
{
	struct tgt_cmd *cmd = r->recv->cmd;

	r->rsp.cid = cmd->cid;
	r->rsp.status = htole16(status);
	memset(&r->rsp_wr, 0, sizeof(r->rsp_wr));
	r->rsp_sge.addr = (uintptr_t)&r->rsp;
	r->rsp_sge.length = sizeof(r->rsp);
	r->rsp_wr.wr_id = (uintptr_t)r;
	r->rsp_wr.sg_list = &r->rsp_sge;
	r->rsp_wr.num_sge = 1;
	r->rsp_wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	if ((cmd->flags & TGT_CMD_F_INVALIDATE) && r->qpair->dev->send_inv_ok) {
		r->rsp_wr.opcode = IBV_WR_SEND_WITH_INV;
		r->rsp_wr.invalidate_rkey = cmd->sgl[0].key;
	} else {
		r->rsp_wr.opcode = IBV_WR_SEND;
	}
}

/* build one RDMA READ or WRITE per keyed SGL descriptor, chained in order */
static void tgt_req_build_data(struct tgt_req *r, enum ibv_wr_opcode opcode, char *local, uint32_t lkey)
{
	struct tgt_cmd *cmd = r->recv->cmd;
	int i;

	r->nwr = cmd->nsgl;
	for (i = 0; i < r->nwr; i++) {
		memset(&r->data_wr[i], 0, sizeof(r->data_wr[i]));
		r->data_sge[i].addr = (uintptr_t)local;
		r->data_sge[i].length = cmd->sgl[i].len;
		r->data_sge[i].lkey = lkey;
		r->data_wr[i].wr_id = (uintptr_t)r;
		r->data_wr[i].opcode = opcode;
		r->data_wr[i].sg_list = &r->data_sge[i];
		r->data_wr[i].num_sge = 1;
		r->data_wr[i].wr.rdma.remote_addr = le64toh(cmd->sgl[i].addr);
		r->data_wr[i].wr.rdma.rkey = le32toh(cmd->sgl[i].key);
		r->data_wr[i].next = &r->data_wr[i + 1];
		local += cmd->sgl[i].len;
	}
	r->data_wr[r->nwr - 1].next = NULL;
}

static int tgt_req_exec(struct tgt_qpair *qpair, struct tgt_req *r)
{
	struct tgt_device *dev = qpair->dev;
	struct tgt_cmd *cmd = r->recv->cmd;
	struct ibv_send_wr *bad;
	struct ibv_mr *mr;
	uint64_t len = 0;
	int access, i;
	char *buf;

	if (cmd->nsgl == 0 || cmd->nsgl > TGT_MAX_SGL)
		return -EINVAL;
	for (i = 0; i < cmd->nsgl; i++)
		len += le32toh(cmd->sgl[i].len);

	if (cmd->opc == TGT_OPC_SET_FEATURES) {
		if (len > TGT_ADMIN_BUF)
			return -EINVAL;
		tgt_req_build_data(r, IBV_WR_RDMA_READ, dev->admin_buf, dev->admin_mr->lkey);
		r->data_wr[r->nwr - 1].send_flags = IBV_SEND_SIGNALED;
		return ibv_post_send(qpair->qp, r->data_wr, &bad); /* BUG: rdma-access-flags-transport -- READ into admin_mr, registered with LOCAL_WRITE only; fails on iWARP */
	}

	buf = r->staging;
	mr = r->staging_mr;
	if (len > TGT_IO_UNIT) {
		r->big = aligned_alloc(4096, len);
		if (!r->big)
			return -ENOMEM;
		access = IBV_ACCESS_LOCAL_WRITE;
		if (cmd->opc == TGT_OPC_WRITE)		/* READ sink: iWARP places the response with our key */
			access |= IBV_ACCESS_REMOTE_WRITE;
		/* OK: rdma-remote-access-overbroad, rdma-access-flags-invalid -- REMOTE_WRITE (with LOCAL_WRITE) only for the READ sink, which iWARP needs */
		r->big_mr = ibv_reg_mr(dev->pd, r->big, len, access); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- registered for this one oversized I/O */
		if (!r->big_mr) {
			free(r->big);
			r->big = NULL;
			return -ENOMEM;
		}
		buf = r->big;
		mr = r->big_mr;
	}

	if (cmd->opc == TGT_OPC_WRITE) {
		tgt_req_build_data(r, IBV_WR_RDMA_READ, buf, mr->lkey);
		r->data_wr[r->nwr - 1].send_flags = IBV_SEND_SIGNALED;
		return ibv_post_send(qpair->qp, r->data_wr, &bad); /* OK: rdma-access-flags-transport -- the sink (staging or big buffer) has REMOTE_WRITE on iWARP */
	}

	/* host read: backend copy, then WRITE chain + response in one post */
	memcpy(buf, dev->ramdisk + le64toh(cmd->slba) * 512, len);
	tgt_req_build_data(r, IBV_WR_RDMA_WRITE, buf, mr->lkey);
	tgt_req_build_rsp(r, 0);
	r->data_wr[r->nwr - 1].next = &r->rsp_wr;
	return ibv_post_send(qpair->qp, r->data_wr, &bad);
}

static void tgt_req_release(struct tgt_qpair *qpair, struct tgt_req *r)
{
	if (r->big_mr) {
		ibv_dereg_mr(r->big_mr); /* BUG: rdma-registration-in-datapath -- per-I/O deregistration on the completion path */
		free(r->big);
		r->big_mr = NULL;
		r->big = NULL;
	}
	tgt_post_srq_recv(qpair->dev, r->recv);
	r->recv = NULL;
	r->next = qpair->free_reqs;
	qpair->free_reqs = r;
}

/* one CQ for the SRQ and every queue pair of the device */
int tgt_device_poll(struct tgt_device *dev, struct tgt_qpair *(*qp_lookup)(uint32_t qp_num))
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc[32];
	struct tgt_qpair *qpair;
	struct tgt_req *r;
	int i, n;

	n = ibv_poll_cq(dev->cq, 32, wc);
	for (i = 0; i < n; i++) {
		qpair = qp_lookup(wc[i].qp_num);
		if (wc[i].opcode == IBV_WC_RECV) {
			r = qpair->free_reqs;
			if (!r) {
				tgt_post_srq_recv(dev, (struct tgt_recv *)(uintptr_t)wc[i].wr_id);
				continue;
			}
			qpair->free_reqs = r->next;
			r->recv = (struct tgt_recv *)(uintptr_t)wc[i].wr_id;
			if (tgt_req_exec(qpair, r)) {
				tgt_req_build_rsp(r, 0x6 /* internal error */);
				ibv_post_send(qpair->qp, &r->rsp_wr, &bad);
			}
			continue;
		}
		r = (struct tgt_req *)(uintptr_t)wc[i].wr_id;
		if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode == IBV_WC_SEND) {
			tgt_req_release(qpair, r);
			continue;
		}
		if (wc[i].opcode == IBV_WC_RDMA_READ) {
			if (r->recv->cmd->opc == TGT_OPC_WRITE)
				memcpy(dev->ramdisk + le64toh(r->recv->cmd->slba) * 512,
				       r->big ? r->big : r->staging,
				       r->data_sge[0].length * r->nwr);
			tgt_req_build_rsp(r, 0);
			ibv_post_send(qpair->qp, &r->rsp_wr, &bad);
		}
	}
	return n;
}
