/* Stand-in for <linux/slab.h> (Linux 6.12): the allocators are macros over
 * alloc_hooks(x_noprof(...)), a statement expression, as in the real tree. */
#ifndef _LINUX_SLAB_H
#define _LINUX_SLAB_H
#include <linux/types.h>

typedef unsigned int gfp_t;
#define GFP_KERNEL ((gfp_t)0xcc0)

/* From <linux/alloc_tag.h> (CONFIG_MEM_ALLOC_PROFILING off keeps the shape). */
struct alloc_tag;
static inline struct alloc_tag *alloc_tag_save(struct alloc_tag *tag) { return tag; }
static inline void alloc_tag_restore(struct alloc_tag *tag, struct alloc_tag *old) {}
#define DEFINE_ALLOC_TAG(_alloc_tag) struct alloc_tag *_alloc_tag = 0
#define alloc_hooks_tag(_tag, _do_alloc)				\
({									\
	struct alloc_tag *_old = alloc_tag_save(_tag);			\
	typeof(_do_alloc) _res = _do_alloc;				\
	alloc_tag_restore(_tag, _old);					\
	_res;								\
})
#define alloc_hooks(_do_alloc)						\
({									\
	DEFINE_ALLOC_TAG(_alloc_tag);					\
	alloc_hooks_tag(_alloc_tag, _do_alloc);				\
})

/* From <linux/gfp_types.h>. */
#define GFP_ATOMIC	((gfp_t)0x820)
#define GFP_NOWAIT	((gfp_t)0x800)
#define GFP_NOIO	((gfp_t)0xc00)
#define GFP_NOFS	((gfp_t)0xc40)
#define __GFP_ZERO	((gfp_t)0x100)

void *kmalloc_noprof(size_t size, gfp_t flags);
void *kzalloc_noprof(size_t size, gfp_t flags);
void *kmalloc_array_noprof(size_t n, size_t size, gfp_t flags);
#define kmalloc(...)		alloc_hooks(kmalloc_noprof(__VA_ARGS__))
#define kzalloc(...)		alloc_hooks(kzalloc_noprof(__VA_ARGS__))
#define kmalloc_array(...)	alloc_hooks(kmalloc_array_noprof(__VA_ARGS__))
#define kcalloc(n, size, flags)	kmalloc_array(n, size, (flags) | __GFP_ZERO)

void kfree(const void *objp);
void *memset(void *s, int c, size_t n);

void *krealloc(const void *objp, size_t new_size, gfp_t flags);
void kvfree(const void *addr);
void *kvzalloc(size_t size, gfp_t flags);

struct kmem_cache;
void *kmem_cache_alloc_noprof(struct kmem_cache *cachep, gfp_t flags);
#define kmem_cache_alloc(...)	alloc_hooks(kmem_cache_alloc_noprof(__VA_ARGS__))
#define kmem_cache_zalloc(_k, _flags)	kmem_cache_alloc(_k, (_flags)|__GFP_ZERO)
void kmem_cache_free(struct kmem_cache *s, void *objp);
#endif
