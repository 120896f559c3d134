/* Stand-in for <linux/unaligned.h> (Linux 6.12). */
#ifndef _LINUX_UNALIGNED_H
#define _LINUX_UNALIGNED_H
#include <linux/types.h>
void put_unaligned_le32(u32 val, void *p);
void put_unaligned_le24(u32 val, u8 *p);
#endif
