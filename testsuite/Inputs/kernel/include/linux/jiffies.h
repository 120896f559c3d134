/* Stand-in for <linux/jiffies.h> (Linux 6.12). */
#ifndef _LINUX_JIFFIES_H
#define _LINUX_JIFFIES_H

#define HZ 1000
extern unsigned long volatile jiffies;
unsigned long __msecs_to_jiffies(const unsigned int m);
static inline unsigned long msecs_to_jiffies(const unsigned int m)
{
	return __msecs_to_jiffies(m);
}

#endif /* _LINUX_JIFFIES_H */
