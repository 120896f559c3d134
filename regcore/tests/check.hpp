// Minimal test harness: TEST(name) registers a case; CHECK* report the
// failing expression and abort the case. main() runs the cases whose names
// match argv[1] (substring, or prefix when it starts with '^'; all by
// default), prints "PASS name"/"FAIL name" per case and a summary, and
// exits non-zero if any case failed.
#pragma once

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace check {

struct Failure {};

struct Case {
  const char *name;
  std::function<void()> fn;
};

inline std::vector<Case> &cases() {
  static std::vector<Case> all;
  return all;
}

struct Registrar {
  Registrar(const char *name, std::function<void()> fn) { cases().push_back({name, std::move(fn)}); }
};

inline void report(const char *file, int line, const std::string &what) {
  std::printf("  %s:%d: %s\n", file, line, what.c_str());
  throw Failure{};
}

inline int run_all(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : "";
  int passed = 0, failed = 0;
  for (const Case &c : cases()) {
    bool prefix = *filter == '^';
    if (prefix ? std::strncmp(c.name, filter + 1, std::strlen(filter + 1)) != 0
               : *filter && !std::strstr(c.name, filter))
      continue;
    try {
      c.fn();
      std::printf("PASS %s\n", c.name);
      passed++;
    } catch (const Failure &) {
      std::printf("FAIL %s\n", c.name);
      failed++;
    }
    std::fflush(stdout);
  }
  std::printf("SUMMARY passed=%d failed=%d\n", passed, failed);
  return failed ? 1 : 0;
}

}  // namespace check

#define CHECK_CAT2(a, b) a##b
#define CHECK_CAT(a, b) CHECK_CAT2(a, b)
#define TEST(name)                                                                 \
  static void CHECK_CAT(test_, name)();                                            \
  static check::Registrar CHECK_CAT(reg_, name)(#name, CHECK_CAT(test_, name));    \
  static void CHECK_CAT(test_, name)()

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) check::report(__FILE__, __LINE__, "CHECK(" #cond ")");  \
  } while (0)

#define CHECK_EQ(a, b)                                                                       \
  do {                                                                                       \
    auto check_a_ = (a);                                                                     \
    auto check_b_ = (b);                                                                     \
    if (!(check_a_ == check_b_))                                                             \
      check::report(__FILE__, __LINE__,                                                      \
                    "CHECK_EQ(" #a ", " #b "): " + std::to_string(static_cast<long long>(check_a_)) + \
                        " != " + std::to_string(static_cast<long long>(check_b_)));          \
  } while (0)
