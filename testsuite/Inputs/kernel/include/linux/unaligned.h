/* Stand-in for <linux/unaligned.h> (Linux 6.12). */
#ifndef _LINUX_UNALIGNED_H
#define _LINUX_UNALIGNED_H
#include <linux/types.h>
void put_unaligned_le32(u32 val, void *p);
void put_unaligned_le24(u32 val, u8 *p);
/* Additions for the accuracy corpus. */
void put_unaligned_le64(u64 val, void *p);
void put_unaligned_be32(u32 val, void *p);
u32 get_unaligned_le32(const void *p);
u64 get_unaligned_le64(const void *p);
#endif
