// Portable form of the demo's RMSNorm rows (demo_norm.h), the same 8-lane order as the AVX2 one.
#include "demo_norm.h"

#include <cmath>
#include <vector>

#include "ot/numeric.h"

namespace ot::demo::norm {

void rms_rows_generic(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  const int64_t H = x.size(1);
  std::vector<float> r(static_cast<size_t>(H));
  for (int64_t t = t0; t < t1; ++t) {
    convert_to_f32(static_cast<const char*>(x.data) + size_t(t * x.stride(0)) * dtype_size(x.dtype), x.dtype, r.data(), H);
    float l[8] = {};
    for (int64_t i = 0; i < H; ++i) l[i % 8] += r[size_t(i)] * r[size_t(i)];
    const float ss = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    const float s = 1.f / std::sqrt(ss / float(H) + eps);
    for (int64_t i = 0; i < H; ++i) r[size_t(i)] = r[size_t(i)] * s * w[i];
    convert_from_f32(r.data(), static_cast<char*>(out.data) + size_t(t * out.stride(0)) * dtype_size(out.dtype), out.dtype, H);
  }
}

}  // namespace ot::demo::norm
