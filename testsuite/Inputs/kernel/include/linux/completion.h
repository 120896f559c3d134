/* Stand-in for <linux/completion.h> (Linux 6.12). */
#ifndef _LINUX_COMPLETION_H
#define _LINUX_COMPLETION_H

#include <linux/types.h>

struct completion {
	unsigned int done;
};

static inline void init_completion(struct completion *x)
{
	x->done = 0;
}

static inline void reinit_completion(struct completion *x)
{
	x->done = 0;
}

void wait_for_completion(struct completion *);
void wait_for_completion_io(struct completion *);
int wait_for_completion_interruptible(struct completion *x);
int wait_for_completion_killable(struct completion *x);
unsigned long wait_for_completion_timeout(struct completion *x,
					  unsigned long timeout);
long wait_for_completion_interruptible_timeout(struct completion *x,
					       unsigned long timeout);
bool try_wait_for_completion(struct completion *x);
bool completion_done(struct completion *x);

void complete(struct completion *);
void complete_all(struct completion *);

#endif /* _LINUX_COMPLETION_H */
