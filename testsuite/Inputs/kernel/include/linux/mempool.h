/* Stand-in for <linux/mempool.h> (Linux 6.12). */
#ifndef _LINUX_MEMPOOL_H
#define _LINUX_MEMPOOL_H
#include <linux/types.h>

struct kmem_cache;
typedef struct mempool_s mempool_t;

mempool_t *mempool_create_kmalloc_pool(int min_nr, size_t size);
mempool_t *mempool_create_slab_pool(int min_nr, struct kmem_cache *kc);
void mempool_destroy(mempool_t *pool);
void *mempool_alloc(mempool_t *pool, gfp_t gfp_mask);
void mempool_free(void *element, mempool_t *pool);

#endif /* _LINUX_MEMPOOL_H */
