/* Stand-in for <linux/compiler.h> and <linux/container_of.h> (Linux 6.12). */
#ifndef _LINUX_COMPILER_H
#define _LINUX_COMPILER_H

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define offsetof(TYPE, MEMBER) __builtin_offsetof(TYPE, MEMBER)
#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#define WARN_ON_ONCE(x) (x)
#define min_t(type, x, y) ((type)(x) < (type)(y) ? (type)(x) : (type)(y))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
#define SZ_4K 0x00001000

#endif
