/* Stand-in for <asm/byteorder.h> (Linux 6.12) on a little-endian machine. */
#ifndef _ASM_BYTEORDER_H
#define _ASM_BYTEORDER_H
#include <linux/types.h>

#define cpu_to_be16(x) ((__be16)__builtin_bswap16((u16)(x)))
#define cpu_to_be32(x) ((__be32)__builtin_bswap32((u32)(x)))
#define cpu_to_be64(x) ((__be64)__builtin_bswap64((u64)(x)))
#define be16_to_cpu(x) ((u16)__builtin_bswap16((u16)(x)))
#define be32_to_cpu(x) ((u32)__builtin_bswap32((u32)(x)))
#define be64_to_cpu(x) ((u64)__builtin_bswap64((u64)(x)))

#endif /* _ASM_BYTEORDER_H */
