/* Stand-in for <linux/types.h> (Linux 6.12): the fixed-size types. */
#ifndef _LINUX_TYPES_H
#define _LINUX_TYPES_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed int s32;
typedef signed long long s64;
typedef u32 __be32;
typedef u16 __be16;
typedef u64 __be64;
typedef unsigned int gfp_t;
typedef long long loff_t;
typedef unsigned long uintptr_t;
typedef u16 __le16;
typedef u32 __le32;
typedef u64 __le64;
typedef unsigned long size_t;
typedef long ssize_t;
typedef u64 dma_addr_t;
typedef _Bool bool;
enum { false = 0, true = 1 };
#define NULL ((void *)0)

struct list_head {
	struct list_head *next, *prev;
};

typedef struct {
	int counter;
} atomic_t;

/* From <asm/byteorder.h> on a little-endian machine. */
#define cpu_to_le64(x) ((__le64)(u64)(x))
#define cpu_to_le32(x) ((__le32)(u32)(x))
#define le64_to_cpu(x) ((u64)(__le64)(x))
#define le32_to_cpu(x) ((u32)(__le32)(x))

#endif
