/* Stand-in for <linux/mutex.h> (Linux 6.12); the lock is opaque here. */
#ifndef _LINUX_MUTEX_H
#define _LINUX_MUTEX_H

struct mutex {
	long owner;
};

void __mutex_init(struct mutex *lock, const char *name, void *key);
#define mutex_init(mutex) __mutex_init((mutex), #mutex, NULL)
void mutex_lock(struct mutex *lock);
void mutex_unlock(struct mutex *lock);

#endif /* _LINUX_MUTEX_H */
