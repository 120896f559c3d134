/* Stand-in for <linux/kernel.h> (Linux 6.12): what ULPs get from it. */
#ifndef _LINUX_KERNEL_H
#define _LINUX_KERNEL_H

#include <linux/types.h>
#include <linux/compiler.h>
#include <linux/printk.h>

#define U8_MAX		((u8)~0U)
#define U32_MAX		((u32)~0U)
#define INT_MAX		((int)(~0U >> 1))
#define UINT_MAX	(~0U)

#define ARRAY_SIZE(arr) (sizeof(arr) / sizeof((arr)[0]))
#define min(x, y) ((x) < (y) ? (x) : (y))
#define max(x, y) ((x) > (y) ? (x) : (y))
#define max_t(type, x, y) ((type)(x) > (type)(y) ? (type)(x) : (type)(y))
#define clamp_t(type, val, lo, hi) min_t(type, max_t(type, val, lo), hi)
#define round_up(x, y) ((((x) - 1) | ((__typeof__(x))((y) - 1))) + 1)
#define ALIGN(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))
#define BIT(nr) (1UL << (nr))

#define WARN_ON(condition) (condition)
#define BUG_ON(condition) do { if (condition) __builtin_trap(); } while (0)

#endif /* _LINUX_KERNEL_H */
