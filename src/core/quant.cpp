#include "ot/quant.h"

#include "ot/cpu.h"
#include "src/core/quant_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ot {

namespace detail {
float quantize_row_i8_scalar(const float* x, int64_t n, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    amax = std::max(amax, a);
    finite &= a <= std::numeric_limits<float>::max();  // false for NaN and Inf
  }
  const float d = finite ? amax / 127.f : std::numeric_limits<float>::quiet_NaN();
  if (!(d > 0)) {
    std::fill(q, q + n, int8_t(0));
    return d;
  }
  // Round half to even without a libm call per value (nearbyint kept this loop at ~40 ns a value):
  // adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to an integer in the default rounding mode,
  // and here |v| <= 127 up to rounding. IEEE order is kept (no -ffast-math in this project).
  constexpr float kRound = 12582912.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = (x[i] / d + kRound) - kRound;
    q[i] = int8_t(std::min(127.f, std::max(-128.f, v)));
  }
  return d;
}

}  // namespace detail

float quantize_row_i8_dynamic(const float* x, int64_t n, int8_t* q) {
  if (n >= 16 && cpu::has(cpu::Isa::avx512)) return detail::quantize_row_i8_avx512(x, n, q);
  return detail::quantize_row_i8_scalar(x, n, q);
}

}  // namespace ot
