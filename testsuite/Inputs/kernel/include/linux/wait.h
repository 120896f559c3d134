/* Stand-in for <linux/wait.h> (Linux 6.12); the waits are simplified. */
#ifndef _LINUX_WAIT_H
#define _LINUX_WAIT_H
#include <linux/types.h>
#include <linux/spinlock.h>

struct wait_queue_head {
	spinlock_t lock;
	struct list_head head;
};
typedef struct wait_queue_head wait_queue_head_t;

void __init_waitqueue_head(struct wait_queue_head *wq_head, const char *name,
			   void *key);
#define init_waitqueue_head(wq_head) \
	__init_waitqueue_head((wq_head), #wq_head, NULL)

void __wake_up(struct wait_queue_head *wq_head, unsigned int mode,
	       int nr, void *key);
#define TASK_NORMAL 3
#define wake_up(x) __wake_up(x, TASK_NORMAL, 1, NULL)
#define wake_up_all(x) __wake_up(x, TASK_NORMAL, 0, NULL)

void schedule(void);
long schedule_timeout(long timeout);

#define wait_event(wq_head, condition) \
	do { while (!(condition)) schedule(); } while (0)
#define wait_event_timeout(wq_head, condition, timeout) ({ \
	long __ret = (timeout); \
	while (!(condition) && __ret) \
		__ret = schedule_timeout(__ret); \
	__ret; \
})
#define wait_event_interruptible(wq_head, condition) ({ \
	while (!(condition)) schedule(); \
	0; \
})

#endif /* _LINUX_WAIT_H */
