/* Stand-in for <linux/string.h> (Linux 6.12). */
#ifndef _LINUX_STRING_H
#define _LINUX_STRING_H
#include <linux/types.h>

void *memcpy(void *dest, const void *src, size_t count);
void *memset(void *s, int c, size_t n);
int memcmp(const void *cs, const void *ct, size_t count);
size_t strlen(const char *s);
ssize_t strscpy(char *dest, const char *src, size_t count);

#endif /* _LINUX_STRING_H */
