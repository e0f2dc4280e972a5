// The expert counts E that the tokens-in-lanes router kernels (router_t8__avx2.cpp, 8 lanes;
// router_t16__avx512.cpp, 16 lanes) are compiled for: the counts of released MoE models. Each count
// is its own instantiation of a fully unrolled kernel (compile time grows with every one): any
// other E takes the AVX2 row kernel (t8) or the run-time vector count (t16).
#pragma once
#include <cstdint>
#include <type_traits>

namespace ot::moe::impl {

template <int... E> struct LaneCounts {};
using RouterLaneCounts = LaneCounts<8, 16, 32, 40, 64, 96, 128, 160, 256>;

namespace lanes_detail {
template <int Width, class F, int E0, int... Es> bool with_vectors(int64_t E, F& f, LaneCounts<E0, Es...>) {
  if constexpr (E0 % Width == 0) {
    if (E == E0) return f(std::integral_constant<int, E0 / Width>{});
  }
  if constexpr (sizeof...(Es) > 0) return with_vectors<Width>(E, f, LaneCounts<Es...>{});
  return false;
}
template <int Width, int... Es> constexpr bool compiled(int64_t E, LaneCounts<Es...>) { return ((E == Es && Es % Width == 0) || ...); }
}  // namespace lanes_detail

// True when a lanes kernel of Width lanes is compiled for E experts.
template <int Width> constexpr bool lanes_kernel_for(int64_t E) { return lanes_detail::compiled<Width>(E, RouterLaneCounts{}); }

// f(std::integral_constant<int, E / Width>) for a compiled E; false (f not called) otherwise.
template <int Width, class F> bool with_lane_vectors(int64_t E, F&& f) { return lanes_detail::with_vectors<Width>(E, f, RouterLaneCounts{}); }

}  // namespace ot::moe::impl
