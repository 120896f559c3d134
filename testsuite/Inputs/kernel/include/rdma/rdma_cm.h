/* Stand-in for <rdma/rdma_cm.h> (Linux 6.12). */
#ifndef RDMA_CM_H
#define RDMA_CM_H

#include <rdma/ib_verbs.h>

struct rdma_cm_id {
	struct ib_device	*device;
	void			*context;
	struct ib_qp		*qp;
	void			*event_handler;
	enum ib_qp_type		 qp_type;
	u32			 port_num;
};

int rdma_create_qp(struct rdma_cm_id *id, struct ib_pd *pd,
		   struct ib_qp_init_attr *qp_init_attr);
void rdma_destroy_qp(struct rdma_cm_id *id);

/* Additions for the accuracy corpus (Linux 6.12 signatures). */
int rdma_disconnect(struct rdma_cm_id *id);
void rdma_destroy_id(struct rdma_cm_id *id);

#endif /* RDMA_CM_H */
