/* A project header with no RDMA code in it. */
#ifndef UTIL_H
#define UTIL_H
#include <stddef.h>
static inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
#endif
