/* Stand-in for <linux/slab.h> (Linux 6.12). */
#ifndef _LINUX_SLAB_H
#define _LINUX_SLAB_H
#include <linux/types.h>

typedef unsigned int gfp_t;
#define GFP_KERNEL ((gfp_t)0xcc0)

void *kmalloc(size_t size, gfp_t flags);
void *kzalloc(size_t size, gfp_t flags);
void *kcalloc(size_t n, size_t size, gfp_t flags);
void kfree(const void *objp);
void *memset(void *s, int c, size_t n);
#endif
