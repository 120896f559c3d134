/*
 * dsel: device selection and queue-pair setup for a storage daemon.
 * Walks the device list, skips anything that is not an InfiniBand-class
 * device with an active port, and sizes the data QP from the device's
 * limits (ibv_query_device_ex): the wanted depth, SGE count and inline
 * size are clamped or read back.  A second, small control QP carries
 * heartbeats.
 *
 * Correct: the data QP's capacities are all compared with the device
 * (max_qp_wr, max_sge) or read back after creation (max_inline_data).
 * Not correct: the control QP, added later in its own helper, asks for 8
 * send SGEs that nothing compares with max_sge (bnxt_re and siw offer 6).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSEL_WANT_DEPTH		8192
#define DSEL_WANT_SGE		16
#define DSEL_WANT_INLINE	256
#define DSEL_CTRL_SGE		8

#define min_t(a, b)	((a) < (b) ? (a) : (b))

struct dsel {
	struct ibv_context *ctx;
	uint8_t             port;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *data_qp;
	struct ibv_qp      *ctrl_qp;
	uint32_t            inline_size;
	uint32_t            depth;
};

static struct ibv_context *dsel_pick_device(uint8_t *port_out)
{
	struct ibv_device **devs;
	struct ibv_context *ctx = NULL;
	int i, n;

	devs = ibv_get_device_list(&n);
	if (!devs)
		return NULL;
	for (i = 0; i < n && !ctx; i++) {
		struct ibv_port_attr pattr;
		struct ibv_context *c;

		if (devs[i]->node_type != IBV_NODE_CA)
			continue;
		c = ibv_open_device(devs[i]);
		if (!c)
			continue;
		if (ibv_query_port(c, 1, &pattr) || pattr.state != IBV_PORT_ACTIVE) {
			ibv_close_device(c);
			continue;
		}
		ctx = c;
		*port_out = 1;
	}
	ibv_free_device_list(devs);
	return ctx;
}

static struct ibv_qp *dsel_create_ctrl_qp(struct dsel *d)
{
	struct ibv_qp_init_attr qpa;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = d->cq;
	qpa.recv_cq = d->cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.sq_sig_all = 1;
	qpa.cap.max_send_wr = 16;
	qpa.cap.max_recv_wr = 16;
	qpa.cap.max_send_sge = DSEL_CTRL_SGE; // BUG: rdma-queue-cap-unchecked -- 8 SGEs; the max_sge read in dsel_open() is only applied to the data QP
	qpa.cap.max_recv_sge = 1;
	return ibv_create_qp(d->pd, &qpa);
}

int dsel_open(struct dsel *d)
{
	struct ibv_device_attr_ex attr;
	struct ibv_qp_init_attr qpa;

	memset(d, 0, sizeof(*d));
	d->ctx = dsel_pick_device(&d->port);
	if (!d->ctx)
		return -ENODEV;
	memset(&attr, 0, sizeof(attr));
	if (ibv_query_device_ex(d->ctx, NULL, &attr))
		goto err_ctx;

	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		goto err_ctx;
	d->depth = min_t(DSEL_WANT_DEPTH, (uint32_t)attr.orig_attr.max_qp_wr);
	d->cq = ibv_create_cq(d->ctx, min_t(2 * d->depth, (uint32_t)attr.orig_attr.max_cqe),
			      NULL, NULL, 0);
	if (!d->cq)
		goto err_pd;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = d->cq;
	qpa.recv_cq = d->cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.sq_sig_all = 1;
	/* OK: rdma-queue-cap-unchecked -- clamped to max_qp_wr */
	qpa.cap.max_send_wr = d->depth;
	qpa.cap.max_recv_wr = d->depth;
	/* OK: rdma-queue-cap-unchecked -- clamped to max_sge */
	qpa.cap.max_send_sge = min_t(DSEL_WANT_SGE, attr.orig_attr.max_sge);
	qpa.cap.max_recv_sge = 1;
	/* OK: rdma-queue-cap-unchecked -- the granted inline size is read back below */
	qpa.cap.max_inline_data = DSEL_WANT_INLINE;
	d->data_qp = ibv_create_qp(d->pd, &qpa);
	if (!d->data_qp && errno == EINVAL) {
		qpa.cap.max_inline_data = 0;
		d->data_qp = ibv_create_qp(d->pd, &qpa);
	}
	if (!d->data_qp)
		goto err_cq;
	d->inline_size = qpa.cap.max_inline_data;

	d->ctrl_qp = dsel_create_ctrl_qp(d);
	if (!d->ctrl_qp)
		goto err_qp;
	return 0;

err_qp:
	ibv_destroy_qp(d->data_qp);
err_cq:
	ibv_destroy_cq(d->cq);
err_pd:
	ibv_dealloc_pd(d->pd);
err_ctx:
	ibv_close_device(d->ctx);
	return -EIO;
}
