/*
 * echod: a tiny echo server on the librdmacm synchronous endpoint API
 * (rdma_getaddrinfo / rdma_create_ep / rdma_get_request), in the style of
 * librdmacm's rdma_server example.  Each request received is echoed back
 * from a second buffer.
 *
 * The endpoint is created with sq_sig_all = 0 to "save completions", and
 * the echo is posted with flags 0 -- nothing on this QP ever asks for a
 * send completion and nothing polls the send CQ.  Each echo leaves its
 * send-queue entry occupied; after max_send_wr echoes every post fails.
 *
 * Correct: message buffers are registered once per connection for local
 * access (rdma_reg_msgs) and deregistered on every exit path.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define ECHO_MSG	256
#define ECHO_DEPTH	16

static int echo_serve_one(struct rdma_cm_id *id)
{
	char rx[ECHO_MSG], tx[ECHO_MSG];
	struct ibv_mr *rx_mr, *tx_mr;
	struct ibv_wc wc;
	int ret;

	/* OK: rdma-local-mr-management, rdma-registration-in-datapath -- once per connection, local access; the echo loop below does not register */
	rx_mr = rdma_reg_msgs(id, rx, sizeof(rx));
	if (!rx_mr)
		return -errno;
	/* OK: rdma-local-mr-management, rdma-registration-in-datapath -- once per connection, local access; the echo loop below does not register */
	tx_mr = rdma_reg_msgs(id, tx, sizeof(tx));
	if (!tx_mr) {
		ret = -errno;
		goto out_rx;
	}
	ret = rdma_post_recv(id, NULL, rx, sizeof(rx), rx_mr);
	if (ret)
		goto out_tx;
	ret = rdma_accept(id, NULL);
	if (ret)
		goto out_tx;

	for (;;) {
		ret = rdma_get_recv_comp(id, &wc);
		if (ret <= 0 || wc.status != IBV_WC_SUCCESS)
			break;
		memcpy(tx, rx, wc.byte_len);
		ret = rdma_post_recv(id, NULL, rx, sizeof(rx), rx_mr);
		if (ret)
			break;
		ret = rdma_post_send(id, NULL, tx, wc.byte_len, tx_mr, 0);
		if (ret) {
			perror("rdma_post_send");
			break;
		}
	}
	rdma_disconnect(id);
out_tx:
	/* OK: rdma-mr-leak, rdma-registration-in-datapath -- both MRs released on every path, once per connection */
	rdma_dereg_mr(tx_mr);
out_rx:
	rdma_dereg_mr(rx_mr);
	return ret;
}

int echo_run(const char *port)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id, *id;
	int ret;

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(NULL, port, &hints, &res);
	if (ret)
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = ECHO_DEPTH;
	attr.cap.max_recv_wr = ECHO_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	// BUG(file): rdma-unsignaled-send-starvation -- only requested WRs complete, and no post requests one
	attr.sq_sig_all = 0;
	ret = rdma_create_ep(&listen_id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	if (ret)
		return -errno;
	ret = rdma_listen(listen_id, 4);
	while (!ret) {
		ret = rdma_get_request(listen_id, &id);
		if (ret)
			break;
		echo_serve_one(id);
		rdma_destroy_ep(id);
	}
	rdma_destroy_ep(listen_id);
	return ret;
}
