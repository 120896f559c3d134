/* Stand-in for <linux/atomic.h> (Linux 6.12); non-atomic bodies. */
#ifndef _LINUX_ATOMIC_H
#define _LINUX_ATOMIC_H

#include <linux/types.h>

#define ATOMIC_INIT(i) { (i) }

static inline int atomic_read(const atomic_t *v) { return v->counter; }
static inline void atomic_set(atomic_t *v, int i) { v->counter = i; }
static inline void atomic_inc(atomic_t *v) { v->counter++; }
static inline void atomic_dec(atomic_t *v) { v->counter--; }
static inline void atomic_add(int i, atomic_t *v) { v->counter += i; }
static inline void atomic_sub(int i, atomic_t *v) { v->counter -= i; }
static inline int atomic_inc_return(atomic_t *v) { return ++v->counter; }
static inline int atomic_dec_return(atomic_t *v) { return --v->counter; }
static inline int atomic_add_return(int i, atomic_t *v) { return v->counter += i; }
static inline int atomic_sub_return(int i, atomic_t *v) { return v->counter -= i; }
static inline bool atomic_dec_and_test(atomic_t *v) { return --v->counter == 0; }
static inline int atomic_xchg(atomic_t *v, int new)
{
	int old = v->counter;

	v->counter = new;
	return old;
}

#endif /* _LINUX_ATOMIC_H */
