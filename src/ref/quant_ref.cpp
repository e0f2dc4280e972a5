// Plain dequantisation: decode each code from its byte, then (q + offset) * scale.
#include "src/ref/quant_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ot::refimpl {

Tensor dequantize_weights(const QuantWeightView& w) {
  const int64_t G = w.data.size(0), K = w.data.size(1), N = w.scale.size(-1);
  const int64_t len = w.group_size ? w.group_size : K, groups = w.group_size ? K / w.group_size : 1;
  Tensor out = Tensor::empty(DType::f32, {G, K, N});
  for (int64_t g = 0; g < G; ++g)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        int q;
        if (w.format == WeightFormat::int4) {
          const int64_t b = g * w.data.stride(0) + k * w.data.stride(1) + (n / 2) * w.data.stride(2);
          const unsigned nib = (unsigned(static_cast<const uint8_t*>(w.data.data)[b]) >> (4 * (n & 1))) & 0xFu;
          q = nib >= 8 ? int(nib) - 16 : int(nib);  // 4-bit two's complement
        } else {
          q = static_cast<const int8_t*>(w.data.data)[g * w.data.stride(0) + k * w.data.stride(1) + n * w.data.stride(2)];
        }
        const int64_t si = (g * groups + k / len) * N + n;  // flat index into the [G, (groups,) N] scale
        const double s = get_as_double(w.scale, si);
        const double o = w.offset.defined() ? get_as_double(w.offset, si) : 0.0;
        out.ptr<float>()[(g * K + k) * N + n] = float((double(q) + o) * s);
      }
  return out;
}

Tensor quantize_dequantize_rows_i8(const TensorView& x) {
  const int64_t M = x.size(0), K = x.size(1);
  Tensor out = Tensor::empty(DType::f32, {M, K});
  float* o = out.ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float amax = 0;
    bool finite = true;
    for (int64_t k = 0; k < K; ++k) {
      const float v = float(get_as_double(x, m * K + k));
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    const float d = amax / 127.f;  // fp32, as the operators compute it
    for (int64_t k = 0; k < K; ++k) {
      float v = 0;
      if (!finite) v = std::numeric_limits<float>::quiet_NaN();
      else if (d > 0) v = std::min(127.f, std::max(-128.f, std::nearbyint(float(get_as_double(x, m * K + k)) / d))) * d;
      o[m * K + k] = v;
    }
  }
  return out;
}

}  // namespace ot::refimpl
