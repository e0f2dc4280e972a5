// The weight index of each row of a grouped matmul, read off its group_list.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/tensor.h"

namespace ot::refgroups {

// type 0: cumulative row counts [G]; 1: row counts [G]; 2: (group, count) rows [G', 2].
// Rows are taken in order; every row of a validated group_list gets a group.
inline std::vector<int64_t> group_of_rows(const TensorView& gl, int type, int64_t rows) {
  std::vector<int64_t> group(static_cast<size_t>(rows), -1);
  int64_t row = 0;
  auto take = [&](int64_t g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) group[size_t(row++)] = g;
  };
  if (type == 2) {
    for (int64_t i = 0; i < gl.size(0); ++i) take(int64_t(get_as_double(gl, 2 * i)), int64_t(get_as_double(gl, 2 * i + 1)));
    return group;
  }
  int64_t prev = 0;
  for (int64_t g = 0; g < gl.size(0); ++g) {
    int64_t v = int64_t(get_as_double(gl, g));
    take(g, type == 1 ? v : v - prev);
    prev = v;
  }
  return group;
}

}  // namespace ot::refgroups
