/* Stand-in for <linux/errno.h> (Linux 6.12). */
#ifndef _LINUX_ERRNO_H
#define _LINUX_ERRNO_H
#define EIO 5
#define EAGAIN 11
#define ENOMEM 12
#define EINVAL 22
#define EOPNOTSUPP 95
#define ECONNRESET 104
/* Additions for the accuracy corpus (asm-generic/errno-base.h, errno.h). */
#define EPERM 1
#define ENOENT 2
#define EINTR 4
#define ENXIO 6
#define E2BIG 7
#define EFAULT 14
#define EBUSY 16
#define ENODEV 19
#define ENOSPC 28
#define ERANGE 34
#define ENODATA 61
#define EPROTO 71
#define EOVERFLOW 75
#define EMSGSIZE 90
#define ENOBUFS 105
#define ENOTCONN 107
#define ESHUTDOWN 108
#define ETIMEDOUT 110
#define ECONNREFUSED 111
#define ECANCELED 125
#endif
