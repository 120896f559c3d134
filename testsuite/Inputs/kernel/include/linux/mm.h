/* Stand-in for <linux/mm.h> (Linux 6.12): pages and the page size. */
#ifndef _LINUX_MM_H
#define _LINUX_MM_H

#include <linux/types.h>

#define PAGE_SHIFT	12
#define PAGE_SIZE	(1UL << PAGE_SHIFT)
#define PAGE_MASK	(~(PAGE_SIZE - 1))

struct page;

void *page_address(const struct page *page);
struct page *virt_to_page(const void *addr);
struct page *alloc_pages(gfp_t gfp, unsigned int order);
#define alloc_page(gfp_mask) alloc_pages(gfp_mask, 0)
void __free_pages(struct page *page, unsigned int order);
#define __free_page(page) __free_pages((page), 0)

#endif /* _LINUX_MM_H */
