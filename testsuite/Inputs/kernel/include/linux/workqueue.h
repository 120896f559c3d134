/* Stand-in for <linux/workqueue.h> (Linux 6.12). */
#ifndef _LINUX_WORKQUEUE_H
#define _LINUX_WORKQUEUE_H
#include <linux/types.h>

struct work_struct;
typedef void (*work_func_t)(struct work_struct *work);

struct work_struct {
	long data;
	struct list_head entry;
	work_func_t func;
};

struct delayed_work {
	struct work_struct work;
	unsigned long timer_expires;
};

struct workqueue_struct;
extern struct workqueue_struct *system_wq;

#define INIT_WORK(_work, _func) do { (_work)->func = (_func); } while (0)
#define INIT_DELAYED_WORK(_work, _func) INIT_WORK(&(_work)->work, (_func))

bool queue_work_on(int cpu, struct workqueue_struct *wq,
		   struct work_struct *work);
#define WORK_CPU_UNBOUND 8192
static inline bool queue_work(struct workqueue_struct *wq,
			      struct work_struct *work)
{
	return queue_work_on(WORK_CPU_UNBOUND, wq, work);
}
static inline bool schedule_work(struct work_struct *work)
{
	return queue_work(system_wq, work);
}
bool queue_delayed_work_on(int cpu, struct workqueue_struct *wq,
			   struct delayed_work *work, unsigned long delay);
static inline bool queue_delayed_work(struct workqueue_struct *wq,
				      struct delayed_work *dwork,
				      unsigned long delay)
{
	return queue_delayed_work_on(WORK_CPU_UNBOUND, wq, dwork, delay);
}
bool cancel_work_sync(struct work_struct *work);
bool cancel_delayed_work_sync(struct delayed_work *dwork);
void flush_workqueue(struct workqueue_struct *wq);

#define to_delayed_work(_work) container_of(_work, struct delayed_work, work)

#endif /* _LINUX_WORKQUEUE_H */
