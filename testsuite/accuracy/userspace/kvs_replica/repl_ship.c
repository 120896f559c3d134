/*
 * repl_ship.c: ships one log record: RDMA WRITE of the record into the
 * replica's log, chained to an inline SEND of the new tail.  The SEND is
 * signaled once every REPL_SIG_EVERY records; the counter it tests is
 * advanced by repl_account_post() (repl_conn.c) after each successful
 * post, so the signaled branch does run.
 */
#include "repl.h"

#include <errno.h>
#include <string.h>

int repl_ship(struct repl_conn *c, uint64_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)(c->log + off), len, c->log_mr->lkey };
	struct ibv_sge tail_sge = { (uintptr_t)&c->tail_msg, sizeof(c->tail_msg), 0 };
	struct ibv_send_wr write, send, *bad;

	c->tail_msg = off + len;
	memset(&write, 0, sizeof(write));
	write.opcode = IBV_WR_RDMA_WRITE;
	write.sg_list = &sge;
	write.num_sge = 1;
	write.wr.rdma.remote_addr = c->remote_log + off;
	write.wr.rdma.rkey = c->remote_log_rkey;
	write.next = &send;

	memset(&send, 0, sizeof(send));
	send.opcode = IBV_WR_SEND;
	send.sg_list = &tail_sge;
	send.num_sge = 1;
	send.send_flags = IBV_SEND_INLINE;
	/* OK: rdma-unsignaled-send-starvation -- c->unsig is advanced by repl_account_post() in repl_conn.c */
	if (c->unsig >= REPL_SIG_EVERY) {
		send.send_flags |= IBV_SEND_SIGNALED;
		c->unsig = 0;
	}
	if (ibv_post_send(c->qp, &write, &bad))
		return -EIO;
	repl_account_post(c);
	return 0;
}
