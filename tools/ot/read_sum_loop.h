// The streaming read behind `ot peak`'s memory figure, for the per-ISA files that instantiate it
// (internal linkage: each file's copy is built with its own flags). Four independent accumulators
// keep several loads in flight; load reads one aligned vector of kLanes floats, add sums two.
#pragma once
#include <cstdint>

namespace ot::cli::peak {
namespace {

template <int kLanes, class V, class Load, class Add>
V read_sum_loop(const float* p, int64_t n, V zero, Load load, Add add) {
  V s0 = zero, s1 = zero, s2 = zero, s3 = zero;
  for (int64_t i = 0; i < n; i += 4 * kLanes) {
    s0 = add(s0, load(p + i));
    s1 = add(s1, load(p + i + kLanes));
    s2 = add(s2, load(p + i + 2 * kLanes));
    s3 = add(s3, load(p + i + 3 * kLanes));
  }
  return add(add(s0, s1), add(s2, s3));
}

}  // namespace
}  // namespace ot::cli::peak
