//===- Sorting.h - A stable sort without a temporary buffer -----*- C++ -*-===//
//
// std::stable_sort in libstdc++ 12 calls std::get_temporary_buffer, which
// Clang 22 reports as deprecated in every unit that instantiates it. Output
// order must stay deterministic, so ties keep their original order here by
// comparing positions instead.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_SORTING_H
#define ULPLINT_TOOL_SORTING_H

#include <algorithm>
#include <numeric>
#include <vector>

namespace ulplint::tool {

/// Sorts \p V by \p Before; elements neither before the other keep the order
/// they had.
template <typename T, typename Less>
void sortKeepingTies(std::vector<T> &V, Less Before) {
  std::vector<size_t> Order(V.size());
  std::iota(Order.begin(), Order.end(), 0);
  std::sort(Order.begin(), Order.end(), [&](size_t X, size_t Y) {
    if (Before(V[X], V[Y]))
      return true;
    if (Before(V[Y], V[X]))
      return false;
    return X < Y;
  });
  std::vector<T> Sorted;
  Sorted.reserve(V.size());
  for (size_t I : Order)
    Sorted.push_back(std::move(V[I]));
  V = std::move(Sorted);
}

} // namespace ulplint::tool

#endif
