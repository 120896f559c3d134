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

struct wait_queue_entry {
	unsigned int flags;
	void *private;
	struct list_head entry;
};
#define TASK_UNINTERRUPTIBLE 2
#define TASK_INTERRUPTIBLE 1
void init_wait_entry(struct wait_queue_entry *wq_entry, int flags);
long prepare_to_wait_event(struct wait_queue_head *wq_head,
			   struct wait_queue_entry *wq_entry, int state);
void finish_wait(struct wait_queue_head *wq_head,
		 struct wait_queue_entry *wq_entry);

/* As in Linux 6.12: every wait_event*() expands to this loop. */
#define ___wait_event(wq_head, condition, state, ret, cmd) ({ \
	struct wait_queue_entry __wq_entry; \
	long __ret = ret; \
	init_wait_entry(&__wq_entry, 0); \
	for (;;) { \
		long __int = prepare_to_wait_event(&wq_head, &__wq_entry, state); \
		if (condition) \
			break; \
		if (state == TASK_INTERRUPTIBLE && __int) { \
			__ret = __int; \
			break; \
		} \
		cmd; \
	} \
	finish_wait(&wq_head, &__wq_entry); \
	__ret; \
})
#define wait_event(wq_head, condition) \
	do { if (!(condition)) \
		(void)___wait_event(wq_head, condition, TASK_UNINTERRUPTIBLE, 0, schedule()); \
	} while (0)
#define wait_event_timeout(wq_head, condition, timeout) \
	___wait_event(wq_head, (condition) || !__ret, TASK_UNINTERRUPTIBLE, timeout, \
		      __ret = schedule_timeout(__ret))
#define wait_event_interruptible(wq_head, condition) \
	___wait_event(wq_head, condition, TASK_INTERRUPTIBLE, 0, schedule())

#endif /* _LINUX_WAIT_H */
