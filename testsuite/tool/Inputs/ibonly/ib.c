/* An InfiniBand-only ULP: its device hook refuses everything else. */
#include <rdma/ib_verbs.h>

struct demo_device_info {
	unsigned int node_type;
};

int demo_add_one(struct ib_device *device, struct demo_device_info *info)
{
	/* Only handle IB (no iWARP) devices */
	if (info->node_type != RDMA_NODE_IB_CA)
		return -EOPNOTSUPP;
	return 0;
}
