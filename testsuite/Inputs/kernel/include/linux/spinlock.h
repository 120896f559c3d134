/* Stand-in for <linux/spinlock.h> (Linux 6.12); the lock is opaque here. */
#ifndef _LINUX_SPINLOCK_H
#define _LINUX_SPINLOCK_H

#include <linux/types.h>

typedef struct spinlock {
	unsigned int rlock;
} spinlock_t;

#define spin_lock_init(lock) do { (lock)->rlock = 0; } while (0)

void spin_lock(spinlock_t *lock);
void spin_unlock(spinlock_t *lock);
void spin_lock_bh(spinlock_t *lock);
void spin_unlock_bh(spinlock_t *lock);
void spin_lock_irq(spinlock_t *lock);
void spin_unlock_irq(spinlock_t *lock);
unsigned long _raw_spin_lock_irqsave(spinlock_t *lock);
void spin_unlock_irqrestore(spinlock_t *lock, unsigned long flags);

#define spin_lock_irqsave(lock, flags) \
	do { (flags) = _raw_spin_lock_irqsave(lock); } while (0)

#endif /* _LINUX_SPINLOCK_H */
