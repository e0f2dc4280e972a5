// Portable causal softmax rows (softmax_rows.h).
#include "src/attn/softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ot::attn {

void softmax_rows_generic(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in) {
  for (int64_t t = 0; t < T; ++t) {
    float* p = P + t * ld;
    const int64_t n = std::min(S, off + t + 1);  // keys seen
    if (lse_in) {
      const float l = lse_in[t];
      for (int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - l);
    } else {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) m = std::max(m, p[j]);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < n; ++j) p[j] *= inv;
      if (lse) lse[t] = m + std::log(sum);
    }
    std::fill(p + n, p + S, 0.f);
  }
}

}  // namespace ot::attn
