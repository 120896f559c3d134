/* Stand-in for <linux/printk.h> (Linux 6.12); no dynamic debug. */
#ifndef _LINUX_PRINTK_H
#define _LINUX_PRINTK_H

#define KERN_SOH	"\001"
#define KERN_ERR	KERN_SOH "3"
#define KERN_WARNING	KERN_SOH "4"
#define KERN_NOTICE	KERN_SOH "5"
#define KERN_INFO	KERN_SOH "6"
#define KERN_DEBUG	KERN_SOH "7"

#ifndef pr_fmt
#define pr_fmt(fmt) fmt
#endif

int _printk(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define printk(fmt, ...) _printk(fmt, ##__VA_ARGS__)

#define pr_err(fmt, ...) printk(KERN_ERR pr_fmt(fmt), ##__VA_ARGS__)
#define pr_warn(fmt, ...) printk(KERN_WARNING pr_fmt(fmt), ##__VA_ARGS__)
#define pr_notice(fmt, ...) printk(KERN_NOTICE pr_fmt(fmt), ##__VA_ARGS__)
#define pr_info(fmt, ...) printk(KERN_INFO pr_fmt(fmt), ##__VA_ARGS__)
#define pr_debug(fmt, ...) printk(KERN_DEBUG pr_fmt(fmt), ##__VA_ARGS__)
#define pr_err_ratelimited(fmt, ...) pr_err(fmt, ##__VA_ARGS__)
#define pr_warn_ratelimited(fmt, ...) pr_warn(fmt, ##__VA_ARGS__)

#endif /* _LINUX_PRINTK_H */
