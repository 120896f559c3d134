/* Stand-in for <linux/errno.h> (Linux 6.12). */
#ifndef _LINUX_ERRNO_H
#define _LINUX_ERRNO_H
#define EIO 5
#define EAGAIN 11
#define ENOMEM 12
#define EINVAL 22
#define EOPNOTSUPP 95
#define ECONNRESET 104
#endif
