// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * smbd: SMB Direct (MS-SMBD) client transport -- connection setup, the
 * credit-gated send path and registration of the buffers the server reads
 * from or writes into with RDMA.
 *
 * The server grants send credits; a message is posted only with a credit in
 * hand and while send_pending is below send_credit_target. Buffers for
 * SMB2 READ/WRITE payloads are registered with FRWR MRs taken from a list
 * allocated at connect time (mr_io_queue_depth entries) and invalidated
 * with LOCAL_INV once the I/O is done, unless the server invalidated them.
 *
 * Wrong: the send queue is sized for the credited messages only, although
 * REG_MR and LOCAL_INV are posted on the same queue outside the credit
 * gate; max_inline_data is a constant never checked against what the QP
 * got; an I/O with more pages than the pre-allocated MRs hold gets a
 * one-off MR allocated and deregistered on the I/O path.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- lifetime checks are not the subject of this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/mempool.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#ifndef cpu_to_le16
#define cpu_to_le16(x) ((__le16)(u16)(x))
#endif

#define SMBD_MAX_SEND_SGE		6
#define SMBD_MAX_RECV_SGE		1
#define SMBD_INLINE_THRESHOLD		128
#define SMBD_RESPONDER_RESOURCES	32

static int smbd_send_credit_target = 255;
module_param(smbd_send_credit_target, int, 0644);
static int smbd_receive_credit_max = 255;
module_param(smbd_receive_credit_max, int, 0644);
static int smbd_max_frmr_depth = 2048;
module_param(smbd_max_frmr_depth, int, 0644);

enum smbd_status { SMBD_CREATED, SMBD_CONNECTED, SMBD_DISCONNECTED };
enum smbd_mr_state { MR_READY, MR_REGISTERED, MR_ERROR };

struct smbd_data_transfer {
	__le16 credits_requested;
	__le16 credits_granted;
	__le16 flags;
	__le16 reserved;
	__le32 remaining_data_length;
	__le32 data_offset;
	__le32 data_length;
	__le32 padding;
};

struct smbd_buffer_descriptor_v1 {
	__le64 offset;
	__le32 token;
	__le32 length;
};

struct smbd_connection {
	enum smbd_status	status;
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;

	int			send_credit_target;
	int			receive_credit_max;
	atomic_t		send_credits;
	atomic_t		send_pending;
	atomic_t		new_credits_offered;
	wait_queue_head_t	wait_send_credits;
	wait_queue_head_t	wait_post_send;
	wait_queue_head_t	wait_send_pending;
	mempool_t		*request_mempool;

	int			max_frmr_depth;
	int			responder_resources;
	int			mr_io_queue_depth;
	struct list_head	mr_list;
	spinlock_t		mr_list_lock;
	atomic_t		mr_ready_count;
	atomic_t		mr_used_count;
	wait_queue_head_t	wait_mr;
	wait_queue_head_t	wait_for_mr_cleanup;
};

struct smbd_request {
	struct smbd_connection	*info;
	struct ib_cqe		cqe;
	struct ib_send_wr	wr;
	struct ib_sge		sge[SMBD_MAX_SEND_SGE];
	int			num_sge;
	bool			inline_ok;
	struct smbd_data_transfer packet;
};

struct smbd_mr {
	struct smbd_connection	*conn;
	struct list_head	list;
	enum smbd_mr_state	state;
	struct ib_mr		*mr;
	struct scatterlist	*sgl;
	int			sgl_count;
	enum dma_data_direction	dir;
	union {
		struct ib_reg_wr	wr;
		struct ib_send_wr	inv_wr;
	};
	struct ib_cqe		cqe;
	bool			need_invalidate;
	bool			oneoff;
	struct completion	invalidate_done;
};

int smbd_negotiate(struct smbd_connection *info);

static void smbd_disconnect(struct smbd_connection *info)
{
	if (info->status == SMBD_CONNECTED) {
		info->status = SMBD_DISCONNECTED;
		rdma_disconnect(info->id);
	}
}

static void send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_request *request =
		container_of(wc->wr_cqe, struct smbd_request, cqe);
	struct smbd_connection *info = request->info;
	int i;

	if (wc->status != IB_WC_SUCCESS || wc->opcode != IB_WC_SEND) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("smbd: send failed: %s\n",
			       ib_wc_status_msg(wc->status));
		smbd_disconnect(info);
	}

	for (i = 0; i < request->num_sge; i++)
		ib_dma_unmap_single(info->id->device, request->sge[i].addr,
				    request->sge[i].length, DMA_TO_DEVICE);

	if (atomic_dec_and_test(&info->send_pending))
		wake_up(&info->wait_send_pending);
	wake_up(&info->wait_post_send);
	mempool_free(request, info->request_mempool);
}

static int smbd_post_send(struct smbd_connection *info,
			  struct smbd_request *request)
{
	int rc, i;

	for (i = 0; i < request->num_sge; i++)
		ib_dma_sync_single_for_device(info->id->device,
					      request->sge[i].addr,
					      request->sge[i].length,
					      DMA_TO_DEVICE);

	request->cqe.done = send_done;
	request->wr.next = NULL;
	request->wr.wr_cqe = &request->cqe;
	request->wr.sg_list = request->sge;
	request->wr.num_sge = request->num_sge;
	request->wr.opcode = IB_WR_SEND;
	request->wr.send_flags = IB_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- every message is signaled; send_done() gives back its send_pending slot
	if (request->inline_ok)
		request->wr.send_flags |= IB_SEND_INLINE;

	rc = ib_post_send(info->id->qp, &request->wr, NULL);
	if (rc) {
		pr_err("smbd: ib_post_send failed rc=%d\n", rc);
		smbd_disconnect(info);
		rc = -EAGAIN;
	}
	return rc;
}

static int smbd_post_send_data(struct smbd_connection *info, void *data,
			       int data_length, int remaining_data_length)
{
	struct smbd_request *request;
	struct smbd_data_transfer *packet;
	int rc, i;

wait_credit:
	rc = wait_event_interruptible(info->wait_send_credits,
				      atomic_read(&info->send_credits) > 0 ||
				      info->status != SMBD_CONNECTED);
	if (rc)
		return rc;
	if (info->status != SMBD_CONNECTED)
		return -EAGAIN;
	if (unlikely(atomic_dec_return(&info->send_credits) < 0)) {
		atomic_inc(&info->send_credits);
		goto wait_credit;
	}

wait_send_queue:
	wait_event(info->wait_post_send,
		   atomic_read(&info->send_pending) < info->send_credit_target ||
		   info->status != SMBD_CONNECTED);
	if (info->status != SMBD_CONNECTED) {
		rc = -EAGAIN;
		goto err_wait_send_queue;
	}
	// OK: rdma-send-queue-undersized -- messages themselves never exceed send_credit_target on the queue
	if (unlikely(atomic_inc_return(&info->send_pending) >
		     info->send_credit_target)) {
		atomic_dec(&info->send_pending);
		goto wait_send_queue;
	}

	request = mempool_alloc(info->request_mempool, GFP_KERNEL);
	if (!request) {
		rc = -ENOMEM;
		goto err_alloc;
	}
	request->info = info;
	request->num_sge = 0;

	packet = &request->packet;
	packet->credits_requested = cpu_to_le16(info->send_credit_target);
	packet->credits_granted =
		cpu_to_le16(atomic_xchg(&info->new_credits_offered, 0));
	packet->flags = 0;
	packet->reserved = 0;
	packet->remaining_data_length = cpu_to_le32(remaining_data_length);
	packet->data_offset = cpu_to_le32(data_length ? sizeof(*packet) : 0);
	packet->data_length = cpu_to_le32(data_length);
	packet->padding = 0;

	request->sge[0].addr = ib_dma_map_single(info->id->device, packet,
						 sizeof(*packet), DMA_TO_DEVICE);
	if (ib_dma_mapping_error(info->id->device, request->sge[0].addr)) {
		rc = -EIO;
		goto err_dma;
	}
	request->sge[0].length = sizeof(*packet);
	request->sge[0].lkey = info->pd->local_dma_lkey;
	request->num_sge = 1;

	if (data_length) {
		request->sge[1].addr = ib_dma_map_single(info->id->device, data,
							 data_length,
							 DMA_TO_DEVICE);
		if (ib_dma_mapping_error(info->id->device,
					 request->sge[1].addr)) {
			rc = -EIO;
			goto err_dma;
		}
		request->sge[1].length = data_length;
		request->sge[1].lkey = info->pd->local_dma_lkey;
		request->num_sge = 2;
	}
	request->inline_ok =
		sizeof(*packet) + data_length <= SMBD_INLINE_THRESHOLD;

	rc = smbd_post_send(info, request);
	if (!rc)
		return 0;

err_dma:
	for (i = 0; i < request->num_sge; i++)
		ib_dma_unmap_single(info->id->device, request->sge[i].addr,
				    request->sge[i].length, DMA_TO_DEVICE);
	mempool_free(request, info->request_mempool);
err_alloc:
	if (atomic_dec_and_test(&info->send_pending))
		wake_up(&info->wait_send_pending);
err_wait_send_queue:
	atomic_inc(&info->send_credits);
	return rc;
}

int smbd_send(struct smbd_connection *info, void *buf, int len)
{
	return smbd_post_send_data(info, buf, len, 0);
}

static void register_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	if (wc->status) {
		pr_err("smbd: REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
		mr->state = MR_ERROR;
		smbd_disconnect(mr->conn);
	}
}

static void local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		pr_err("smbd: LOCAL_INV failed: %s\n",
		       ib_wc_status_msg(wc->status));
		mr->state = MR_ERROR;
		smbd_disconnect(mr->conn);
	}
	complete(&mr->invalidate_done);
}

static int allocate_mr_list(struct smbd_connection *info)
{
	struct smbd_mr *smbdirect_mr, *tmp;
	int i;

	INIT_LIST_HEAD(&info->mr_list);
	spin_lock_init(&info->mr_list_lock);
	init_waitqueue_head(&info->wait_mr);
	init_waitqueue_head(&info->wait_for_mr_cleanup);
	atomic_set(&info->mr_ready_count, 0);
	atomic_set(&info->mr_used_count, 0);

	for (i = 0; i < info->mr_io_queue_depth; i++) {
		smbdirect_mr = kzalloc(sizeof(*smbdirect_mr), GFP_KERNEL);
		if (!smbdirect_mr)
			goto cleanup_entries;
		// OK: rdma-registration-in-datapath -- the MR list is filled once per connection
		smbdirect_mr->mr = ib_alloc_mr(info->pd, IB_MR_TYPE_MEM_REG,
					       info->max_frmr_depth);
		if (IS_ERR(smbdirect_mr->mr)) {
			kfree(smbdirect_mr);
			goto cleanup_entries;
		}
		smbdirect_mr->sgl = kcalloc(info->max_frmr_depth,
					    sizeof(struct scatterlist),
					    GFP_KERNEL);
		if (!smbdirect_mr->sgl) {
			ib_dereg_mr(smbdirect_mr->mr);
			kfree(smbdirect_mr);
			goto cleanup_entries;
		}
		smbdirect_mr->state = MR_READY;
		smbdirect_mr->conn = info;
		list_add_tail(&smbdirect_mr->list, &info->mr_list);
		atomic_inc(&info->mr_ready_count);
	}
	return 0;

cleanup_entries:
	list_for_each_entry_safe(smbdirect_mr, tmp, &info->mr_list, list) {
		list_del(&smbdirect_mr->list);
		ib_dereg_mr(smbdirect_mr->mr);
		kfree(smbdirect_mr->sgl);
		kfree(smbdirect_mr);
	}
	return -ENOMEM;
}

static void destroy_mr_list(struct smbd_connection *info)
{
	struct smbd_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &info->mr_list, list) {
		list_del(&mr->list);
		ib_dereg_mr(mr->mr);	// OK: rdma-registration-in-datapath -- the whole list is torn down with the connection
		kfree(mr->sgl);
		kfree(mr);
	}
}

static struct smbd_mr *get_mr(struct smbd_connection *info)
{
	struct smbd_mr *ret;
	int rc;
again:
	rc = wait_event_interruptible(info->wait_mr,
				      atomic_read(&info->mr_ready_count) ||
				      info->status != SMBD_CONNECTED);
	if (rc || info->status != SMBD_CONNECTED)
		return NULL;

	spin_lock(&info->mr_list_lock);
	list_for_each_entry(ret, &info->mr_list, list) {
		if (ret->state == MR_READY) {
			ret->state = MR_REGISTERED;
			spin_unlock(&info->mr_list_lock);
			atomic_dec(&info->mr_ready_count);
			atomic_inc(&info->mr_used_count);
			return ret;
		}
	}
	spin_unlock(&info->mr_list_lock);
	goto again;
}

/* An MR made for one oversized I/O goes away with that I/O. */
static void smbd_free_oneoff_mr(struct smbd_mr *smbdirect_mr)
{
	ib_dereg_mr(smbdirect_mr->mr);	// BUG: rdma-registration-in-datapath -- runs at the end of every oversized I/O (and on its error path)
	kfree(smbdirect_mr->sgl);
	kfree(smbdirect_mr);
}

/*
 * Register the pages of an SMB2 READ (writing == true: the server writes
 * into them) or WRITE payload for the server's RDMA.
 */
struct smbd_mr *smbd_register_mr(struct smbd_connection *info,
				 struct page *pages[], int num_pages,
				 int offset, int tailsz, bool writing,
				 bool need_invalidate)
{
	struct smbd_mr *smbdirect_mr;
	struct ib_reg_wr *reg_wr;
	int rc, i;

	if (num_pages > info->max_frmr_depth) {
		/* too big for the pre-allocated MRs */
		smbdirect_mr = kzalloc(sizeof(*smbdirect_mr), GFP_NOIO);
		if (!smbdirect_mr)
			return NULL;
		smbdirect_mr->sgl = kcalloc(num_pages, sizeof(struct scatterlist),
					    GFP_NOIO);
		if (!smbdirect_mr->sgl)
			goto free_oneoff;
		smbdirect_mr->mr = ib_alloc_mr(info->pd, IB_MR_TYPE_MEM_REG, num_pages);	// BUG: rdma-registration-in-datapath -- a device MR allocated on the I/O path for every oversized read or write
		if (IS_ERR(smbdirect_mr->mr))
			goto free_oneoff;
		smbdirect_mr->conn = info;
		smbdirect_mr->oneoff = true;
		smbdirect_mr->state = MR_REGISTERED;
		atomic_inc(&info->mr_used_count);
	} else {
		smbdirect_mr = get_mr(info);
		if (!smbdirect_mr)
			return NULL;
	}
	smbdirect_mr->need_invalidate = need_invalidate;
	smbdirect_mr->sgl_count = num_pages;
	sg_init_table(smbdirect_mr->sgl, num_pages);

	if (num_pages == 1) {
		sg_set_page(&smbdirect_mr->sgl[0], pages[0], tailsz, offset);
	} else {
		sg_set_page(&smbdirect_mr->sgl[0], pages[0],
			    PAGE_SIZE - offset, offset);
		for (i = 1; i < num_pages - 1; i++)
			sg_set_page(&smbdirect_mr->sgl[i], pages[i], PAGE_SIZE, 0);
		sg_set_page(&smbdirect_mr->sgl[i], pages[i],
			    tailsz ? tailsz : PAGE_SIZE, 0);
	}

	smbdirect_mr->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	rc = ib_dma_map_sg(info->id->device, smbdirect_mr->sgl, num_pages,
			   smbdirect_mr->dir);
	if (!rc)
		goto dma_map_error;

	rc = ib_map_mr_sg(smbdirect_mr->mr, smbdirect_mr->sgl, num_pages,
			  NULL, PAGE_SIZE);
	if (rc != num_pages)
		goto map_mr_error;

	ib_update_fast_reg_key(smbdirect_mr->mr,
			       ib_inc_rkey(smbdirect_mr->mr->rkey));
	reg_wr = &smbdirect_mr->wr;
	reg_wr->wr.opcode = IB_WR_REG_MR;
	smbdirect_mr->cqe.done = register_mr_done;
	reg_wr->wr.wr_cqe = &smbdirect_mr->cqe;
	reg_wr->wr.num_sge = 0;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = smbdirect_mr->mr;	// OK: rdma-rkey-reuse -- the key was advanced with ib_inc_rkey() just above
	reg_wr->key = smbdirect_mr->mr->rkey;
	// OK: rdma-remote-access-overbroad -- the rkey is the token of the buffer descriptor sent to the server
	reg_wr->access = writing ? IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE : IB_ACCESS_REMOTE_READ;	// OK: rdma-access-flags-invalid -- remote read alone needs no local write

	rc = ib_post_send(info->id->qp, &reg_wr->wr, NULL);
	if (!rc)
		return smbdirect_mr;

	pr_err("smbd: ib_post_send failed rc=%d reg_wr->key=%x\n", rc,
	       reg_wr->key);
	smbd_disconnect(info);
map_mr_error:
	ib_dma_unmap_sg(info->id->device, smbdirect_mr->sgl, num_pages,
			smbdirect_mr->dir);
dma_map_error:
	if (!smbdirect_mr->oneoff) {
		smbdirect_mr->state = MR_READY;
		atomic_inc(&info->mr_ready_count);
		wake_up(&info->wait_mr);
		atomic_dec(&info->mr_used_count);
		return NULL;
	}
	atomic_dec(&info->mr_used_count);
	smbd_free_oneoff_mr(smbdirect_mr);
	return NULL;

free_oneoff:
	kfree(smbdirect_mr->sgl);
	kfree(smbdirect_mr);
	return NULL;
}

void smbd_mr_fill_descriptor(struct smbd_mr *mr,
			     struct smbd_buffer_descriptor_v1 *desc)
{
	desc->offset = cpu_to_le64(mr->mr->iova);
	desc->token = cpu_to_le32(mr->mr->rkey);
	desc->length = cpu_to_le32(mr->mr->length);
}

int smbd_deregister_mr(struct smbd_mr *smbdirect_mr)
{
	struct smbd_connection *info = smbdirect_mr->conn;
	struct ib_send_wr *wr;
	int rc = 0;

	if (smbdirect_mr->need_invalidate) {
		wr = &smbdirect_mr->inv_wr;
		wr->next = NULL;
		wr->opcode = IB_WR_LOCAL_INV;
		smbdirect_mr->cqe.done = local_inv_done;
		wr->wr_cqe = &smbdirect_mr->cqe;
		wr->num_sge = 0;
		wr->ex.invalidate_rkey = smbdirect_mr->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;

		init_completion(&smbdirect_mr->invalidate_done);
		rc = ib_post_send(info->id->qp, wr, NULL);
		if (rc) {
			pr_err("smbd: LOCAL_INV post failed rc=%d\n", rc);
			smbd_disconnect(info);
			goto done;
		}
		wait_for_completion(&smbdirect_mr->invalidate_done);
		smbdirect_mr->need_invalidate = false;
	}

	ib_dma_unmap_sg(info->id->device, smbdirect_mr->sgl,
			smbdirect_mr->sgl_count, smbdirect_mr->dir);

	if (smbdirect_mr->oneoff) {
		smbd_free_oneoff_mr(smbdirect_mr);
		goto done;
	}

	spin_lock(&info->mr_list_lock);
	smbdirect_mr->state = MR_READY;
	spin_unlock(&info->mr_list_lock);
	if (atomic_inc_return(&info->mr_ready_count) == 1)
		wake_up(&info->wait_mr);
done:
	if (atomic_dec_and_test(&info->mr_used_count))
		wake_up(&info->wait_for_mr_cleanup);
	return rc;
}

static void smbd_qp_async_error_upcall(struct ib_event *event, void *context)
{
	smbd_disconnect(context);
}

int smbd_get_connection(struct smbd_connection *info, struct rdma_cm_id *id)
{
	struct ib_qp_init_attr qp_attr;
	struct ib_device *dev = id->device;
	int rc;

	info->id = id;
	info->status = SMBD_CREATED;
	info->send_credit_target = smbd_send_credit_target;
	info->receive_credit_max = smbd_receive_credit_max;
	info->max_frmr_depth = smbd_max_frmr_depth;
	info->responder_resources = SMBD_RESPONDER_RESOURCES;
	info->mr_io_queue_depth = 2 * info->responder_resources;

	if (info->send_credit_target > dev->attrs.max_cqe ||
	    info->send_credit_target > dev->attrs.max_qp_wr) {
		pr_err("smbd: consider lowering send_credit_target = %d (max_cqe %d max_qp_wr %d)\n",
		       info->send_credit_target, dev->attrs.max_cqe,
		       dev->attrs.max_qp_wr);
		return -EINVAL;
	}
	if (info->receive_credit_max > dev->attrs.max_cqe ||
	    info->receive_credit_max > dev->attrs.max_qp_wr)
		return -EINVAL;
	if (dev->attrs.max_send_sge < SMBD_MAX_SEND_SGE ||
	    dev->attrs.max_recv_sge < SMBD_MAX_RECV_SGE) {
		pr_err("smbd: device max_send_sge/max_recv_sge = %d/%d too small\n",
		       dev->attrs.max_send_sge, dev->attrs.max_recv_sge);
		return -EINVAL;
	}
	if (info->max_frmr_depth > dev->attrs.max_fast_reg_page_list_len)
		info->max_frmr_depth = dev->attrs.max_fast_reg_page_list_len;

	info->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(info->pd))
		return PTR_ERR(info->pd);
	info->send_cq = ib_alloc_cq(dev, info, info->send_credit_target, 0,
				    IB_POLL_SOFTIRQ);
	if (IS_ERR(info->send_cq)) {
		rc = PTR_ERR(info->send_cq);
		goto alloc_cq_failed;
	}
	info->recv_cq = ib_alloc_cq(dev, info, info->receive_credit_max, 0,
				    IB_POLL_SOFTIRQ);
	if (IS_ERR(info->recv_cq)) {
		rc = PTR_ERR(info->recv_cq);
		goto alloc_recv_cq_failed;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.event_handler = smbd_qp_async_error_upcall;
	qp_attr.qp_context = info;
	/* one entry per send credit, +1 for ib_drain_qp() */
	qp_attr.cap.max_send_wr = info->send_credit_target + 1;	// BUG(file): rdma-send-queue-undersized -- REG_MR and LOCAL_INV of up to mr_io_queue_depth MRs share this queue outside the send_pending gate, so each I/O needs REG_MR + SEND + LOCAL_INV
	qp_attr.cap.max_recv_wr = info->receive_credit_max + 1;
	qp_attr.cap.max_send_sge = SMBD_MAX_SEND_SGE;	// OK: rdma-queue-cap-unchecked -- compared with attrs.max_send_sge above
	qp_attr.cap.max_recv_sge = SMBD_MAX_RECV_SGE;
	qp_attr.cap.max_inline_data = SMBD_INLINE_THRESHOLD;	// BUG: rdma-queue-cap-unchecked -- 128 bytes of inline data requested blindly and the granted value is never read back; QP creation fails on devices with less
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = info->send_cq;
	qp_attr.recv_cq = info->recv_cq;

	rc = rdma_create_qp(info->id, info->pd, &qp_attr);
	if (rc) {
		pr_err("smbd: rdma_create_qp failed %d\n", rc);
		goto create_qp_failed;
	}

	info->request_mempool = mempool_create_kmalloc_pool(
		info->send_credit_target, sizeof(struct smbd_request));
	if (!info->request_mempool) {
		rc = -ENOMEM;
		goto mempool_failed;
	}

	rc = allocate_mr_list(info);
	if (rc)
		goto allocate_mr_failed;

	init_waitqueue_head(&info->wait_send_credits);
	init_waitqueue_head(&info->wait_post_send);
	init_waitqueue_head(&info->wait_send_pending);
	atomic_set(&info->send_pending, 0);
	atomic_set(&info->new_credits_offered, 0);
	atomic_set(&info->send_credits, 1);
	info->status = SMBD_CONNECTED;

	rc = smbd_negotiate(info);
	if (rc)
		goto negotiation_failed;
	return 0;

negotiation_failed:
	smbd_disconnect(info);
	ib_drain_qp(info->id->qp);
	destroy_mr_list(info);
allocate_mr_failed:
	mempool_destroy(info->request_mempool);
mempool_failed:
	rdma_destroy_qp(info->id);
create_qp_failed:
	ib_free_cq(info->recv_cq);
alloc_recv_cq_failed:
	ib_free_cq(info->send_cq);
alloc_cq_failed:
	ib_dealloc_pd(info->pd);
	return rc;
}

void smbd_destroy(struct smbd_connection *info)
{
	smbd_disconnect(info);
	wait_event(info->wait_send_pending,
		   atomic_read(&info->send_pending) == 0);
	ib_drain_qp(info->id->qp);
	wait_event(info->wait_for_mr_cleanup,
		   atomic_read(&info->mr_used_count) == 0);
	destroy_mr_list(info);
	mempool_destroy(info->request_mempool);
	rdma_destroy_qp(info->id);
	ib_free_cq(info->recv_cq);
	ib_free_cq(info->send_cq);
	ib_dealloc_pd(info->pd);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("SMB Direct client transport");
