// Batcher's odd-even merge sort as a compile-time list of comparators, pruned to the outputs a
// top-k needs: the vertical (tokens-in-lanes) sorts of the router kernels, AVX-512
// (router_t16__avx512.h) and AVX2 (router_t8__avx2.cpp). ISA-free: each kernel applies the
// comparators with its own vector min / max (its own unrolled run_net: defined under the kernel's
// target options, so its comparators inline).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace ot::moe::impl::net {

// Batcher's odd-even merge sort of n = 16 (63 comparators) or 8 (19; comparator (a, b), a < b, puts
// the larger value at a), pruned to those the first `live` outputs depend on.
struct Net {
  int n = 0;
  uint8_t a[64] = {}, b[64] = {};
};
constexpr Net batcher16(int live, int n = 16) {
  Net all;
  for (int p = 1; p < n; p *= 2)
    for (int k = p; k >= 1; k /= 2)
      for (int j = k % p; j + k < n; j += 2 * k)
        for (int i = 0; i < std::min(k, n - j - k); ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
            all.a[all.n] = uint8_t(i + j);
            all.b[all.n] = uint8_t(i + j + k);
            ++all.n;
          }
  bool need[16] = {}, keep[64] = {};
  for (int i = 0; i < live; ++i) need[i] = true;
  for (int c = all.n - 1; c >= 0; --c)
    if (need[all.a[c]] || need[all.b[c]]) keep[c] = need[all.a[c]] = need[all.b[c]] = true;
  Net net;
  for (int c = 0; c < all.n; ++c)
    if (keep[c]) {
      net.a[net.n] = all.a[c];
      net.b[net.n] = all.b[c];
      ++net.n;
    }
  return net;
}
template <int Live, int N = 16> struct NetOf {
  static constexpr Net net = batcher16(Live, N);
};
static_assert(NetOf<16>::net.n == 63 && NetOf<8, 8>::net.n == 19);

}  // namespace ot::moe::impl::net
