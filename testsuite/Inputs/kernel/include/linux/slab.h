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

/* From <linux/gfp_types.h>. */
#define GFP_ATOMIC	((gfp_t)0x820)
#define GFP_NOWAIT	((gfp_t)0x800)
#define GFP_NOIO	((gfp_t)0xc00)
#define GFP_NOFS	((gfp_t)0xc40)
#define __GFP_ZERO	((gfp_t)0x100)

void *kmalloc_array(size_t n, size_t size, gfp_t flags);
void *krealloc(const void *objp, size_t new_size, gfp_t flags);
void kvfree(const void *addr);
void *kvzalloc(size_t size, gfp_t flags);

struct kmem_cache;
void *kmem_cache_alloc(struct kmem_cache *cachep, gfp_t flags);
void *kmem_cache_zalloc(struct kmem_cache *k, gfp_t flags);
void kmem_cache_free(struct kmem_cache *s, void *objp);
#endif
