/* A kernel unit as an arm64 build compiles it: only a compile for arm64
 * sees the code below the #error. */
#ifndef __aarch64__
#error "not compiled for arm64"
#endif
#include <rdma/ib_verbs.h>

struct demo_dev {
	struct ib_device *ibdev;
	struct ib_pd *pd;
};

int demo_alloc_pd(struct demo_dev *dev)
{
	dev->pd = ib_alloc_pd(dev->ibdev, IB_PD_UNSAFE_GLOBAL_RKEY);
	return dev->pd ? 0 : -ENOMEM;
}
