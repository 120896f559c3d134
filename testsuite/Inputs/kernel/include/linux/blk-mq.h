/*
 * Stand-in for <linux/blk-mq.h> and <linux/blk_types.h> (Linux 6.12): the
 * calls a block ULP makes from its completion path. struct request is opaque
 * here; blk_mq_rq_to_pdu() and blk_mq_rq_from_pdu() are declared rather than
 * inline.
 */
#ifndef _LINUX_BLK_MQ_H
#define _LINUX_BLK_MQ_H
#include <linux/types.h>
#include <linux/scatterlist.h>

typedef u8 blk_status_t;
#define BLK_STS_OK		((blk_status_t)0)
#define BLK_STS_NOTSUPP		((blk_status_t)1)
#define BLK_STS_TIMEOUT		((blk_status_t)2)
#define BLK_STS_NOSPC		((blk_status_t)3)
#define BLK_STS_TRANSPORT	((blk_status_t)4)
#define BLK_STS_RESOURCE	((blk_status_t)9)
#define BLK_STS_IOERR		((blk_status_t)10)

enum blk_eh_timer_return {
	BLK_EH_DONE,
	BLK_EH_RESET_TIMER,
};

struct request;
struct request_queue;
struct blk_mq_hw_ctx;

struct blk_mq_queue_data {
	struct request *rq;
	bool last;
};

void *blk_mq_rq_to_pdu(struct request *rq);
struct request *blk_mq_rq_from_pdu(void *pdu);
void blk_mq_start_request(struct request *rq);
void blk_mq_end_request(struct request *rq, blk_status_t error);
void blk_mq_complete_request(struct request *rq);
bool blk_mq_complete_request_remote(struct request *rq);
unsigned short blk_rq_nr_phys_segments(struct request *rq);
unsigned int blk_rq_payload_bytes(struct request *rq);
int blk_rq_map_sg(struct request_queue *q, struct request *rq,
		  struct scatterlist *sglist);
bool op_is_write(unsigned int op);
unsigned int req_op(const struct request *req);
#define rq_data_dir(rq) (op_is_write(req_op(rq)) ? 1 : 0)
#define WRITE 1

#endif /* _LINUX_BLK_MQ_H */
