/*
 * nbdr: target side of an NBD-like block protocol over RDMA.  Commands
 * arrive as SENDs; a READ command is served by RDMA-WRITEing the data into
 * the client's buffer followed by the reply SEND, a WRITE command by
 * RDMA-READing the client's data into a bounce buffer, writing it to the
 * backing file, then the reply SEND.
 *
 * Bounce buffers are the sinks of RDMA READs, so they are registered with
 * NBDR_SINK_ACCESS (LOCAL_WRITE | REMOTE_WRITE), unconditionally: an iWARP
 * READ response is placed through the sink's STag.  Their rkey is never
 * sent, which is right: nobody but the READ responder needs it.
 *
 * Not correct: the send queue holds one entry per command slot (+1), but a
 * READ command posts WRITE + SEND; with all slots busy with READs the queue
 * overflows and ibv_post_send() fails with ENOMEM.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDR_SLOTS		64
#define NBDR_MAX_IO		(128 * 1024)
#define NBDR_SINK_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

enum { NBDR_CMD_READ = 0, NBDR_CMD_WRITE = 1 };

struct nbdr_cmd {
	uint32_t type;
	uint32_t handle;
	uint64_t offset;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct nbdr_reply {
	uint32_t handle;
	uint32_t error;
};

struct nbdr_slot {
	struct nbdr_cmd    cmd;
	struct nbdr_reply  reply;
	char              *bounce;
	struct ibv_sge     data_sge, reply_sge;
	struct ibv_send_wr data_wr, reply_wr;
};

struct nbdr {
	int                fd;
	struct ibv_pd     *pd;
	struct ibv_cq     *cq;
	struct ibv_qp     *qp;
	struct nbdr_slot   slots[NBDR_SLOTS];
	char              *bounce_area;
	struct ibv_mr     *bounce_mr;
	struct ibv_mr     *slot_mr;
};

int nbdr_setup(struct nbdr *t)
{
	struct ibv_qp_init_attr attr;
	int i;

	t->bounce_area = aligned_alloc(4096, (size_t)NBDR_SLOTS * NBDR_MAX_IO);
	if (!t->bounce_area)
		return -ENOMEM;
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE on READ sinks is what iWARP needs, without sending the key */
	t->bounce_mr = ibv_reg_mr(t->pd, t->bounce_area, (size_t)NBDR_SLOTS * NBDR_MAX_IO, // BUG: rdma-local-mr-management -- lkey addresses the target's own RDMA READ/WRITE
				  NBDR_SINK_ACCESS);
	if (!t->bounce_mr)
		goto err_area;
	/* OK: rdma-local-mr-management -- command/reply slots, local access, once */
	t->slot_mr = ibv_reg_mr(t->pd, t->slots, sizeof(t->slots), IBV_ACCESS_LOCAL_WRITE);
	if (!t->slot_mr)
		goto err_bounce;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = t->cq;
	attr.recv_cq = t->cq;
	attr.qp_type = IBV_QPT_RC;
	// BUG(file): rdma-send-queue-undersized -- a READ command posts RDMA WRITE + reply SEND, 2 per slot
	attr.cap.max_send_wr = NBDR_SLOTS + 1;
	attr.cap.max_recv_wr = NBDR_SLOTS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	t->qp = ibv_create_qp(t->pd, &attr);
	if (!t->qp)
		goto err_slot;

	for (i = 0; i < NBDR_SLOTS; i++) {
		struct nbdr_slot *s = &t->slots[i];
		struct ibv_sge sge = { (uintptr_t)&s->cmd, sizeof(s->cmd), t->slot_mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		s->bounce = t->bounce_area + (size_t)i * NBDR_MAX_IO;
		if (ibv_post_recv(t->qp, &rwr, &bad))
			goto err_qp;
	}
	return 0;

err_qp:
	ibv_destroy_qp(t->qp);
err_slot:
	ibv_dereg_mr(t->slot_mr);
err_bounce:
	ibv_dereg_mr(t->bounce_mr);
err_area:
	free(t->bounce_area);
	return -ENOMEM;
}

static void nbdr_prep_reply(struct nbdr *t, struct nbdr_slot *s, int idx, uint32_t err)
{
	s->reply.handle = s->cmd.handle;
	s->reply.error = htobe32(err);
	s->reply_sge = (struct ibv_sge){ (uintptr_t)&s->reply, sizeof(s->reply), t->slot_mr->lkey };
	memset(&s->reply_wr, 0, sizeof(s->reply_wr));
	s->reply_wr.wr_id = idx;
	s->reply_wr.opcode = IBV_WR_SEND;
	s->reply_wr.sg_list = &s->reply_sge;
	s->reply_wr.num_sge = 1;
	s->reply_wr.send_flags = IBV_SEND_SIGNALED;
}

int nbdr_handle_cmd(struct nbdr *t, int idx)
{
	struct nbdr_slot *s = &t->slots[idx];
	uint32_t len = be32toh(s->cmd.len);
	struct ibv_send_wr *bad;

	if (len > NBDR_MAX_IO) {
		nbdr_prep_reply(t, s, idx, EINVAL);
		return ibv_post_send(t->qp, &s->reply_wr, &bad);
	}
	s->data_sge = (struct ibv_sge){ (uintptr_t)s->bounce, len, t->bounce_mr->lkey };
	memset(&s->data_wr, 0, sizeof(s->data_wr));
	s->data_wr.wr_id = idx;
	s->data_wr.sg_list = &s->data_sge;
	s->data_wr.num_sge = 1;
	s->data_wr.wr.rdma.remote_addr = be64toh(s->cmd.addr);
	s->data_wr.wr.rdma.rkey = be32toh(s->cmd.rkey);

	if (be32toh(s->cmd.type) == NBDR_CMD_READ) {
		ssize_t n = pread(t->fd, s->bounce, len, be64toh(s->cmd.offset));

		nbdr_prep_reply(t, s, idx, n == (ssize_t)len ? 0 : EIO);
		s->data_wr.opcode = IBV_WR_RDMA_WRITE;
		s->data_wr.next = &s->reply_wr;
	} else {
		/* OK: rdma-access-flags-transport -- the bounce sink carries REMOTE_WRITE on every path */
		s->data_wr.opcode = IBV_WR_RDMA_READ;
		s->data_wr.send_flags = IBV_SEND_SIGNALED;
	}
	return ibv_post_send(t->qp, &s->data_wr, &bad);
}

/* the RDMA READ of a WRITE command completed: store the data and reply */
int nbdr_write_fetched(struct nbdr *t, int idx)
{
	struct nbdr_slot *s = &t->slots[idx];
	uint32_t len = be32toh(s->cmd.len);
	struct ibv_send_wr *bad;
	ssize_t n;

	n = pwrite(t->fd, s->bounce, len, be64toh(s->cmd.offset));
	nbdr_prep_reply(t, s, idx, n == (ssize_t)len ? 0 : EIO);
	return ibv_post_send(t->qp, &s->reply_wr, &bad);
}
