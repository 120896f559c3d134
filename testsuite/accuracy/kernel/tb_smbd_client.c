// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * tb_smbd_client.c - SMB Direct (MS-SMBD) client transport: connection QP
 * and the memory registrations used for RDMA READ/WRITE channels of SMB2
 * READ and WRITE (cifs smbdirect style).
 *
 * The connection owns a list of MRs (twice the responder resources). An
 * I/O picks an MR in state MR_READY, maps the pages and posts a signaled
 * REG_MR; the rkey goes into the SMB2 channel descriptor. When the I/O is
 * done, smbd_deregister_mr() posts a LOCAL_INV and waits for it, unless
 * the server was asked to invalidate the key itself
 * (SMB2_CHANNEL_RDMA_V1_INVALIDATE). MRs whose registration or
 * invalidation failed are deregistered and re-allocated by a worker.
 *
 * Known problems: an MR handed to the server for remote invalidation is
 * made MR_READY again without any check that the server did invalidate it
 * (completions are never looked at for IB_WC_WITH_INVALIDATE); the send
 * queue is sized for the send credits only, not for the REG_MR and
 * LOCAL_INV work requests; a failed scatterlist allocation frees an entry
 * with its MR still registered.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-rkey-reuse, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define log_rdma_mr(fmt, ...) pr_err("smbd: %s: " fmt, __func__, ##__VA_ARGS__)

enum smbd_mr_state {
	MR_READY,
	MR_REGISTERED,
	MR_INVALIDATED,
	MR_ERROR
};

enum smbd_status {
	SMBD_CONNECTED,
	SMBD_DISCONNECTING,
	SMBD_DISCONNECTED,
};

struct smbd_connection;

struct smbd_mr {
	struct smbd_connection	*conn;
	struct list_head	list;
	enum smbd_mr_state	state;
	struct ib_mr		*mr;
	struct sg_table		sgt;
	enum dma_data_direction	dir;
	union {
		struct ib_reg_wr	wr;
		struct ib_send_wr	inv_wr;
	};
	struct ib_cqe		cqe;
	bool			need_invalidate;
	struct completion	invalidate_done;
};

struct smbd_request {
	struct smbd_connection	*info;
	struct ib_cqe		cqe;
	struct ib_sge		sge[1];
	int			num_sge;
};

struct smbd_response {
	struct smbd_connection	*info;
	struct ib_cqe		cqe;
	bool			negotiate;
	u8			packet[128];
};

struct smbd_connection {
	enum smbd_status	transport_status;
	int			negotiate_rc;
	struct completion	negotiate_completion;
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	int			send_credit_target;
	int			receive_credit_max;
	int			responder_resources;
	int			max_frmr_depth;
	enum ib_mr_type		mr_type;
	struct list_head	mr_list;
	spinlock_t		mr_list_lock;
	atomic_t		mr_ready_count;
	atomic_t		mr_used_count;
	atomic_t		send_pending;
	wait_queue_head_t	wait_mr;
	wait_queue_head_t	wait_for_mr_cleanup;
	struct work_struct	mr_recovery_work;
	struct workqueue_struct	*workqueue;
};

static void smbd_disconnect_rdma_connection(struct smbd_connection *info)
{
	if (info->transport_status == SMBD_CONNECTED) {
		info->transport_status = SMBD_DISCONNECTING;
		rdma_disconnect(info->id);
	}
}

static void send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_request *request =
		container_of(wc->wr_cqe, struct smbd_request, cqe);

	if (wc->status != IB_WC_SUCCESS || wc->opcode != IB_WC_SEND) {
		log_rdma_mr("send error status=%d\n", wc->status);
		smbd_disconnect_rdma_connection(request->info);
	}
	atomic_dec(&request->info->send_pending);
	kfree(request);
}

static int smbd_post_send(struct smbd_connection *info,
			  struct smbd_request *request)
{
	struct ib_send_wr send_wr;

	request->cqe.done = send_done;
	send_wr.next = NULL;
	send_wr.wr_cqe = &request->cqe;
	send_wr.sg_list = request->sge;
	send_wr.num_sge = request->num_sge;
	send_wr.opcode = IB_WR_SEND;
	send_wr.send_flags = IB_SEND_SIGNALED;

	atomic_inc(&info->send_pending);
	return ib_post_send(info->id->qp, &send_wr, NULL);
}

static int smbd_process_negotiate_resp(struct smbd_connection *info,
				       void *packet, struct ib_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- no key is offered before negotiation; an invalidation here is refused */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		log_rdma_mr("negotiate response invalidated rkey %#x\n",
			    wc->ex.invalidate_rkey);
		return -EPROTO;
	}
	if (wc->byte_len < 32)
		return -EINVAL;
	return 0;
}

int smbd_create_qp(struct smbd_connection *info)
{
	struct ib_qp_init_attr qp_attr;
	int rc;

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = info;
	/* OK: rdma-send-queue-manual-factor -- no per-request factor, the credits are taken as they are */
	qp_attr.cap.max_send_wr = info->send_credit_target + 1; /* BUG(file): rdma-send-queue-undersized -- one entry per send credit, but each I/O also posts a REG_MR and a LOCAL_INV */
	qp_attr.cap.max_recv_wr = info->receive_credit_max + 1;
	qp_attr.cap.max_send_sge = 1;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = info->send_cq;
	qp_attr.recv_cq = info->recv_cq;

	rc = rdma_create_qp(info->id, info->pd, &qp_attr);
	if (rc)
		log_rdma_mr("rdma_create_qp failed %d\n", rc);
	return rc;
}

static void smbd_mr_recovery_work(struct work_struct *work)
{
	struct smbd_connection *info =
		container_of(work, struct smbd_connection, mr_recovery_work);
	struct smbd_mr *smbdirect_mr;

	list_for_each_entry(smbdirect_mr, &info->mr_list, list) {
		if (smbdirect_mr->state != MR_ERROR)
			continue;

		/* recoverable MR: deregister it and get a fresh one */
		ib_dereg_mr(smbdirect_mr->mr); /* OK: rdma-invalidation-leak -- deregistration kills whatever key the failed I/O left */
		smbdirect_mr->mr = ib_alloc_mr(info->pd, info->mr_type, info->max_frmr_depth); /* OK: rdma-mr-leak -- the old MR was deregistered just above */
		if (IS_ERR(smbdirect_mr->mr)) {
			log_rdma_mr("ib_alloc_mr failed\n");
			smbdirect_mr->mr = NULL;
			smbd_disconnect_rdma_connection(info);
			continue;
		}

		smbdirect_mr->state = MR_READY;
		if (atomic_inc_return(&info->mr_ready_count) == 1)
			wake_up(&info->wait_mr);
	}
}

int allocate_mr_list(struct smbd_connection *info)
{
	struct smbd_mr *smbdirect_mr, *tmp;
	int i;

	INIT_LIST_HEAD(&info->mr_list);
	init_waitqueue_head(&info->wait_mr);
	init_waitqueue_head(&info->wait_for_mr_cleanup);
	spin_lock_init(&info->mr_list_lock);
	atomic_set(&info->mr_ready_count, 0);
	atomic_set(&info->mr_used_count, 0);
	INIT_WORK(&info->mr_recovery_work, smbd_mr_recovery_work);

	/* twice the responder resources, so a new I/O does not wait for recovery */
	for (i = 0; i < info->responder_resources * 2; i++) {
		smbdirect_mr = kzalloc(sizeof(*smbdirect_mr), GFP_KERNEL);
		if (!smbdirect_mr)
			goto cleanup_entries;
		smbdirect_mr->mr = ib_alloc_mr(info->pd, info->mr_type,
					       info->max_frmr_depth);
		if (IS_ERR(smbdirect_mr->mr)) {
			log_rdma_mr("ib_alloc_mr failed mr_type=%x depth=%x\n",
				    info->mr_type, info->max_frmr_depth);
			goto out; /* OK: rdma-mr-leak -- nothing was allocated */
		}
		smbdirect_mr->sgt.sgl = kcalloc(info->max_frmr_depth,
						sizeof(struct scatterlist),
						GFP_KERNEL);
		if (!smbdirect_mr->sgt.sgl) {
			log_rdma_mr("failed to allocate sgl\n");
			goto out; /* BUG: rdma-mr-leak -- smbdirect_mr->mr is freed with its holder, never deregistered */
		}
		smbdirect_mr->state = MR_READY;
		smbdirect_mr->conn = info;

		list_add_tail(&smbdirect_mr->list, &info->mr_list);
		atomic_inc(&info->mr_ready_count);
	}
	return 0;

out:
	kfree(smbdirect_mr);
cleanup_entries:
	list_for_each_entry_safe(smbdirect_mr, tmp, &info->mr_list, list) {
		list_del(&smbdirect_mr->list);
		ib_dereg_mr(smbdirect_mr->mr);
		kfree(smbdirect_mr->sgt.sgl);
		kfree(smbdirect_mr);
	}
	return -ENOMEM;
}

void destroy_mr_list(struct smbd_connection *info)
{
	struct smbd_mr *mr, *tmp;

	cancel_work_sync(&info->mr_recovery_work);
	list_for_each_entry_safe(mr, tmp, &info->mr_list, list) {
		if (mr->mr)
			ib_dereg_mr(mr->mr); /* OK: rdma-invalidation-leak -- teardown deregisters every MR before unmapping */
		if (mr->state == MR_INVALIDATED)
			ib_dma_unmap_sg(info->id->device, mr->sgt.sgl,
					mr->sgt.nents, mr->dir);
		kfree(mr->sgt.sgl);
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
		info->transport_status != SMBD_CONNECTED);
	if (rc || info->transport_status != SMBD_CONNECTED)
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

static void register_mr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *mr = container_of(wc->wr_cqe, struct smbd_mr, cqe);

	if (wc->status) {
		log_rdma_mr("status=%d\n", wc->status);
		smbd_disconnect_rdma_connection(mr->conn);
	}
}

static void local_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_mr *smbdirect_mr =
		container_of(wc->wr_cqe, struct smbd_mr, cqe);

	smbdirect_mr->state = MR_INVALIDATED;
	if (wc->status != IB_WC_SUCCESS) {
		log_rdma_mr("invalidate failed status=%x\n", wc->status);
		smbdirect_mr->state = MR_ERROR;
	}
	complete(&smbdirect_mr->invalidate_done);
}

struct smbd_mr *smbd_register_mr(struct smbd_connection *info,
				 struct page **pages, int num_pages,
				 bool writing, bool need_invalidate)
{
	struct smbd_mr *smbdirect_mr;
	struct ib_reg_wr *reg_wr;
	int rc, i;

	if (num_pages > info->max_frmr_depth)
		return NULL;

	smbdirect_mr = get_mr(info);
	if (!smbdirect_mr)
		return NULL;

	smbdirect_mr->need_invalidate = need_invalidate;
	smbdirect_mr->sgt.nents = num_pages;
	sg_init_table(smbdirect_mr->sgt.sgl, num_pages);
	for (i = 0; i < num_pages; i++)
		sg_set_page(&smbdirect_mr->sgt.sgl[i], pages[i], PAGE_SIZE, 0);

	smbdirect_mr->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	rc = ib_dma_map_sg(info->id->device, smbdirect_mr->sgt.sgl,
			   smbdirect_mr->sgt.nents, smbdirect_mr->dir);
	if (!rc)
		goto dma_map_error;

	rc = ib_map_mr_sg(smbdirect_mr->mr, smbdirect_mr->sgt.sgl,
			  smbdirect_mr->sgt.nents, NULL, PAGE_SIZE);
	if (rc != smbdirect_mr->sgt.nents)
		goto map_mr_error;

	ib_update_fast_reg_key(smbdirect_mr->mr,
			       ib_inc_rkey(smbdirect_mr->mr->rkey));
	reg_wr = &smbdirect_mr->wr;
	reg_wr->wr.opcode = IB_WR_REG_MR;
	smbdirect_mr->cqe.done = register_mr_done;
	reg_wr->wr.wr_cqe = &smbdirect_mr->cqe;
	reg_wr->wr.num_sge = 0;
	reg_wr->wr.send_flags = IB_SEND_SIGNALED;
	reg_wr->mr = smbdirect_mr->mr;
	reg_wr->key = smbdirect_mr->mr->rkey;
	reg_wr->access = writing ?
			 IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			 IB_ACCESS_REMOTE_READ;

	rc = ib_post_send(info->id->qp, &reg_wr->wr, NULL);
	if (!rc)
		return smbdirect_mr;

	log_rdma_mr("ib_post_send failed rc=%x key=%x\n", rc, reg_wr->key);
map_mr_error:
	/* OK: rdma-invalidation-leak -- the REG_MR was not posted, the key was never valid */
	ib_dma_unmap_sg(info->id->device, smbdirect_mr->sgt.sgl,
			smbdirect_mr->sgt.nents, smbdirect_mr->dir);
dma_map_error:
	smbdirect_mr->state = MR_ERROR;
	if (atomic_dec_and_test(&info->mr_used_count))
		wake_up(&info->wait_for_mr_cleanup);
	smbd_disconnect_rdma_connection(info);
	return NULL;
}

/* unmap the pages and make the MR available to the next I/O */
static void smbd_mr_make_ready(struct smbd_connection *info,
			       struct smbd_mr *smbdirect_mr)
{
	ib_dma_unmap_sg(info->id->device, smbdirect_mr->sgt.sgl,
			smbdirect_mr->sgt.nents, smbdirect_mr->dir);
	smbdirect_mr->state = MR_READY;
	if (atomic_inc_return(&info->mr_ready_count) == 1)
		wake_up(&info->wait_mr);
}

int smbd_deregister_mr(struct smbd_mr *smbdirect_mr)
{
	struct smbd_connection *info = smbdirect_mr->conn;
	struct ib_send_wr *wr;
	int rc = 0;

	if (smbdirect_mr->need_invalidate) {
		/* finish the local invalidation before returning */
		wr = &smbdirect_mr->inv_wr;
		wr->opcode = IB_WR_LOCAL_INV;
		smbdirect_mr->cqe.done = local_inv_done;
		wr->wr_cqe = &smbdirect_mr->cqe;
		wr->num_sge = 0;
		wr->ex.invalidate_rkey = smbdirect_mr->mr->rkey;
		wr->send_flags = IB_SEND_SIGNALED;

		init_completion(&smbdirect_mr->invalidate_done);
		rc = ib_post_send(info->id->qp, wr, NULL);
		if (rc) {
			log_rdma_mr("ib_post_send failed rc=%x\n", rc);
			smbd_disconnect_rdma_connection(info);
			goto done;
		}
		wait_for_completion(&smbdirect_mr->invalidate_done);
		smbdirect_mr->need_invalidate = false;
	} else {
		/* the server was asked to invalidate it (SMB2_CHANNEL_RDMA_V1_INVALIDATE) */
		smbdirect_mr->state = MR_INVALIDATED;
	}

	if (smbdirect_mr->state == MR_INVALIDATED)
		/* BUG: rdma-invalidation-leak -- on the remote-invalidation path nothing checked that the server invalidated this rkey */
		smbd_mr_make_ready(info, smbdirect_mr); /* OK: rdma-unmap-before-invalidate -- the LOCAL_INV path waited for its completion */
	else
		queue_work(info->workqueue, &info->mr_recovery_work);

done:
	if (atomic_dec_and_test(&info->mr_used_count))
		wake_up(&info->wait_for_mr_cleanup);
	return rc;
}

int smbd_post_send_negotiate_req(struct smbd_connection *info, u64 dma,
				 u32 len)
{
	struct smbd_request *request;
	int rc;

	request = kzalloc(sizeof(*request), GFP_KERNEL);
	if (!request)
		return -ENOMEM;
	request->info = info;
	request->sge[0].addr = dma;
	request->sge[0].length = len;
	request->sge[0].lkey = info->pd->local_dma_lkey;
	request->num_sge = 1;

	rc = smbd_post_send(info, request);
	if (rc) {
		atomic_dec(&info->send_pending);
		kfree(request);
	}
	return rc;
}

/* the data transfer path (reassembly queue) lives in the upper layer */
void smbd_enqueue_reassembly(struct smbd_connection *info, void *packet,
			     u32 len);

void smbd_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_response *response =
		container_of(wc->wr_cqe, struct smbd_response, cqe);
	struct smbd_connection *info = response->info;

	if (wc->status != IB_WC_SUCCESS || wc->opcode != IB_WC_RECV) {
		log_rdma_mr("recv error status=%d\n", wc->status);
		smbd_disconnect_rdma_connection(info);
		return;
	}

	if (response->negotiate) {
		info->negotiate_rc = smbd_process_negotiate_resp(info,
						response->packet, wc);
		complete(&info->negotiate_completion);
		return;
	}
	smbd_enqueue_reassembly(info, response->packet, wc->byte_len);
}

MODULE_LICENSE("GPL");
