// Memory-event monitor: tells the registration cache when memory it
// registered leaves the process's mapping, so that no registration of
// unmapped, remapped or released memory is ever returned.
//
// userfaultfd in non-cooperative mode reports, for registered ranges,
// UNMAP (munmap, brk shrink, mmap over a range, mremap shrink), REMOVE
// (madvise DONTNEED/FREE/REMOVE) and REMAP (mremap moves). Ranges are
// registered in write-protect mode and nothing is ever write-protected, so
// no page fault is ever trapped. The kernel makes the thread that unmaps
// wait until the event was read; a reader thread reads them at once and
// appends them to a log. A thread whose munmap returned therefore finds its
// event in the log (or the reader busy with it) when it next asks the
// cache, which applies the log before every lookup.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <thread>

#include "internal.hpp"

namespace rc {

namespace {

std::mutex g_mu;
Monitor *g_monitor = nullptr;
std::atomic<bool> g_forked{false};

// In a child the reader thread does not exist and the child's mappings are
// no longer registered: its caches must stop trusting idle entries.
void register_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
                   [] {
                     monitor_forked();
                     g_mu.unlock();
                   });
  });
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

// The child's caches must notice at their next lookup: dirty() stays true.
void monitor_forked() {
  g_forked.store(true, std::memory_order_release);
  if (g_monitor) g_monitor->busy_.fetch_or(1, std::memory_order_acq_rel);
}

namespace {

int uffd_syscall(int flags) { return static_cast<int>(syscall(SYS_userfaultfd, flags)); }

// User-mode-only descriptors work without privileges even when
// vm.unprivileged_userfaultfd is 0 (Linux 5.11); /dev/userfaultfd (6.1)
// works where the syscall is filtered but the device is accessible.
int open_uffd(const char **why) {
  const int flags = O_CLOEXEC | O_NONBLOCK;
  int fd = uffd_syscall(flags | UFFD_USER_MODE_ONLY);
  if (fd < 0 && errno == EINVAL) fd = uffd_syscall(flags);
#ifdef USERFAULTFD_IOC_NEW
  if (fd < 0) {
    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
      fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
      close(dev);
    }
  }
#endif
  if (fd < 0) {
    *why = errno == EPERM || errno == EACCES
               ? "userfaultfd not permitted (vm.unprivileged_userfaultfd, seccomp)"
               : "userfaultfd unavailable";
    return -1;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    *why = "userfaultfd lacks unmap/remove/remap events";
    close(fd);
    return -1;
  }
  return fd;
}

bool register_wp(int fd, uintptr_t start, uintptr_t end) {
  uffdio_register r{};
  r.range.start = start;
  r.range.len = end - start;
  r.mode = UFFDIO_REGISTER_MODE_WP;
  return ioctl(fd, UFFDIO_REGISTER, &r) == 0;
}

// Write-protect mode on anonymous memory needs Linux 5.7.
bool wp_mode_works(int fd) {
  long page = sysconf(_SC_PAGESIZE);
  void *p = mmap(nullptr, static_cast<size_t>(page), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  auto a = reinterpret_cast<uintptr_t>(p);
  bool ok = register_wp(fd, a, a + static_cast<uintptr_t>(page));
  if (ok) {
    uffdio_range r{a, static_cast<uint64_t>(page)};
    ioctl(fd, UFFDIO_UNREGISTER, &r);
  }
  munmap(p, static_cast<size_t>(page));
  return ok;
}

}  // namespace

void SpinLock::lock_slow() {
  for (unsigned spins = 0;; spins++) {
    if (!flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire))
      return;
    if (spins < 64)
      cpu_relax();
    else
      sched_yield();
  }
}

Monitor::Monitor() {
  for (uint64_t i = 0; i < kLog; i++) {
    log_start_[i].store(0, std::memory_order_relaxed);
    log_end_[i].store(0, std::memory_order_relaxed);
  }
}

Monitor::~Monitor() {
  if (thread_) {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) != sizeof one) {
    }
    auto *t = static_cast<std::thread *>(thread_);
    t->join();
    delete t;
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (fd_ >= 0) close(fd_);  // unregisters every range
}

void Monitor::start() {
  fd_ = open_uffd(&status_);
  if (fd_ < 0) return;
  if (!wp_mode_works(fd_)) {
    status_ = "userfaultfd write-protect registration unsupported (Linux < 5.7)";
    close(fd_);
    fd_ = -1;
    return;
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    status_ = "eventfd failed";
    close(fd_);
    fd_ = -1;
    return;
  }
  status_ = "userfaultfd";
  thread_ = new std::thread([this] { run(); });
}

Monitor *Monitor::acquire() {
  register_fork_handlers();
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_monitor) {
    g_monitor = new Monitor();
    g_monitor->start();
  }
  g_monitor->users_++;
  return g_monitor;
}

void Monitor::release(Monitor *m) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--m->users_ > 0) return;
  if (g_forked.load(std::memory_order_acquire)) return;  // no reader thread to stop here
  g_monitor = nullptr;
  delete m;
}

bool Monitor::active() const { return fd_ >= 0 && !g_forked.load(std::memory_order_acquire); }

std::vector<AddrRange> RangeCoverage::change(uintptr_t a, uintptr_t b, int delta) {
  std::vector<AddrRange> flipped;
  split(a);
  split(b);
  for (auto it = cov_.find(a); it->first < b; ++it) {
    uintptr_t end = std::next(it)->first;
    int before = it->second;
    it->second += delta;
    if ((before == 0) != (it->second == 0)) {
      if (!flipped.empty() && flipped.back().end == it->first)
        flipped.back().end = end;
      else
        flipped.push_back({it->first, end});
    }
  }
  // Merge equal neighbours in and around [a, b] only: O(log n + changed).
  auto it = cov_.find(a);
  if (it != cov_.begin()) --it;
  while (it != cov_.end() && it->first <= b) {
    auto next = std::next(it);
    if (next != cov_.end() && next->second == it->second)
      cov_.erase(next);
    else
      it = next;
  }
  if (!cov_.empty() && cov_.begin()->second == 0) cov_.erase(cov_.begin());  // leading zero run
  return flipped;
}

void RangeCoverage::split(uintptr_t at) {
  auto it = cov_.upper_bound(at);
  int count = it == cov_.begin() ? 0 : std::prev(it)->second;
  cov_.emplace(at, count);
}

// Whole 2 MiB windows where the kernel accepts them (anonymous memory and
// shmem; holes are fine): registering page ranges would split a mapping
// into a VMA per cached buffer and run into vm.max_map_count, while
// adjacent registered windows merge. Memory near a cached buffer then
// reports its unmaps too, which only costs the reader thread a wake-up.
bool Monitor::watch(uintptr_t start, uintptr_t end, AddrRange *watched) {
  if (!active()) return false;
  constexpr uintptr_t kWindow = 2u << 20;
  AddrRange w{start & ~(kWindow - 1), (end + kWindow - 1) & ~(kWindow - 1)};
  std::lock_guard<std::mutex> lock(watch_mu_);
  // Registering again is harmless, and needed: the pages may belong to a
  // new mapping since an earlier registration.
  if (!register_wp(fd_, w.start, w.end)) {
    w = {start, end};
    if (!register_wp(fd_, start, end)) return false;
  }
  watched_.add(w.start, w.end);
  *watched = w;
  return true;
}

void Monitor::unwatch(uintptr_t start, uintptr_t end) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(watch_mu_);
  for (const AddrRange &r : watched_.remove(start, end)) {
    uffdio_range range{r.start, r.end - r.start};
    ioctl(fd_, UFFDIO_UNREGISTER, &range);  // fails harmlessly where unmapped
  }
}

uint64_t Monitor::settle() const {
  while (busy_.load(std::memory_order_acquire) & 1) sched_yield();
  return head_.load(std::memory_order_acquire);
}

bool Monitor::ranges(uint64_t from, uint64_t to, std::vector<AddrRange> &out) const {
  if (to - from > kLog) return false;
  for (uint64_t i = from; i < to; i++)
    out.push_back({log_start_[i % kLog].load(std::memory_order_relaxed),
                   log_end_[i % kLog].load(std::memory_order_relaxed)});
  // Slots are reused: if the reader lapped `from` meanwhile, some were torn.
  return head_.load(std::memory_order_acquire) - from <= kLog;
}

void Monitor::publish(uintptr_t start, uintptr_t end) {
  uint64_t i = head_.load(std::memory_order_relaxed);
  log_start_[i % kLog].store(start, std::memory_order_relaxed);
  log_end_[i % kLog].store(end, std::memory_order_relaxed);
  head_.store(i + 1, std::memory_order_release);
}

// The reader never allocates, frees or takes a lock: it must keep reading
// even while other threads block in munmap on it.
void Monitor::run() {
  uffd_msg msgs[64];
  for (;;) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    busy_.fetch_add(1, std::memory_order_acq_rel);  // odd: events leave the kernel
    for (;;) {
      ssize_t n = read(fd_, msgs, sizeof msgs);
      if (n <= 0) break;
      for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(uffd_msg)); i++) {
        const uffd_msg &m = msgs[i];
        switch (m.event) {
          case UFFD_EVENT_UNMAP:
          case UFFD_EVENT_REMOVE:
            publish(m.arg.remove.start, m.arg.remove.end);
            break;
          case UFFD_EVENT_REMAP:
            publish(m.arg.remap.from, m.arg.remap.from + m.arg.remap.len);
            break;
          case UFFD_EVENT_PAGEFAULT: {
            // Not expected (nothing is write-protected): let the thread go.
            uffdio_writeprotect wp{};
            wp.range.start = m.arg.pagefault.address & ~static_cast<uint64_t>(4095);
            wp.range.len = 4096;
            ioctl(fd_, UFFDIO_WRITEPROTECT, &wp);
            break;
          }
          default:
            break;
        }
      }
    }
    busy_.fetch_add(1, std::memory_order_release);  // even: all published
  }
}

}  // namespace rc
