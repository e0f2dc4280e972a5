// The weight quantiser and the validation of quantised weights (ot/quant_weights.h).
#include "ot/quant_weights.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ot/error.h"
#include "src/ref/quant_ref.h"

namespace ot {

const char* weight_format_name(WeightFormat f) { return f == WeightFormat::int4 ? "int4" : "int8"; }

namespace {

struct Range { int qmin, qmax; };
Range range_of(WeightFormat f) { return f == WeightFormat::int4 ? Range{-8, 7} : Range{-128, 127}; }

bool all_finite(const TensorView& v) {
  for (int64_t i = 0; i < v.numel(); ++i)
    if (!std::isfinite(get_as_double(v, i))) return false;
  return true;
}

void check_group_size(const char* op, int64_t gs, int64_t K) {
  OT_CHECK(gs == 0 || gs == 32 || gs == 64 || gs == 128, op, "group_size", "0 (per output channel), 32, 64 or 128", gs);
  OT_CHECK(gs == 0 || K % gs == 0, op, "group_size", detail::cat("a divisor of K = ", K), gs);
}

// w as [G, K, N] (a 2-D w is one group).
TensorView as_3d(const char* op, const TensorView& w) {
  OT_CHECK(w.ndim == 2 || w.ndim == 3, op, "w", "[G, K, N] or [K, N]", w.shape_str());
  OT_CHECK(is_float(w.dtype), op, "w", "fp32, bf16 or fp16", dtype_name(w.dtype));
  if (w.ndim == 3) return w;
  return TensorView(w.data, w.dtype, {1, w.size(0), w.size(1)}, {w.size(0) * w.stride(0), w.stride(0), w.stride(1)});
}

// Expert g of a [G, K, N] view as contiguous fp32 [K, N].
std::vector<float> expert_f32(const TensorView& w, int64_t g) {
  std::vector<float> out(size_t(w.size(1) * w.size(2)));
  copy_into(w.select(0, g), TensorView(out.data(), DType::f32, {w.size(1), w.size(2)}));
  for (size_t i = 0; i < out.size(); ++i)
    OT_CHECK(std::isfinite(out[i]), "quantize_weights", "w", "finite values", "NaN or Inf at expert ", g, ", element ", i);
  return out;
}

// Codes of w for the scales/offsets in s/o ([G, groups, N] fp32, o may be empty).
Tensor encode(const TensorView& w, const float* s, const float* o, WeightFormat f, int64_t groups) {
  const int64_t G = w.size(0), K = w.size(1), N = w.size(2), len = K / groups;
  const Range r = range_of(f);
  const bool i4 = f == WeightFormat::int4;
  Tensor q = Tensor::zeros(i4 ? DType::u8 : DType::i8, {G, K, i4 ? (N + 1) / 2 : N});
  for (int64_t g = 0; g < G; ++g) {
    const std::vector<float> wg = expert_f32(w, g);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t si = (g * groups + k / len) * N + n;
        const float sc = s[si], off = o ? o[si] : 0.f;
        int code = 0;
        if (sc != 0.f) {
          const float v = std::round(wg[size_t(k * N + n)] / sc - off);  // ties away from zero
          code = int(std::min(float(r.qmax), std::max(float(r.qmin), v)));
        }
        if (!i4) {
          q.ptr<int8_t>()[(g * K + k) * N + n] = int8_t(code);
        } else {
          uint8_t& b = q.ptr<uint8_t>()[(g * K + k) * ((N + 1) / 2) + n / 2];
          b = uint8_t(b | ((unsigned(code) & 0xFu) << (4 * (n & 1))));
        }
      }
  }
  return q;
}

// fp32 copy of a scale/offset view as [G, groups, N].
std::vector<float> read_f32(const TensorView& v) {
  std::vector<float> out(size_t(v.numel()));
  Tensor c = Tensor::copy_of(v);
  for (int64_t i = 0; i < v.numel(); ++i) out[size_t(i)] = float(get_as_double(c, i));
  return out;
}

Tensor f32_tensor(const std::vector<float>& v, int64_t G, int64_t groups, int64_t N, int64_t gs) {
  Tensor t = gs ? Tensor::empty(DType::f32, {G, groups, N}) : Tensor::empty(DType::f32, {G, N});
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

}  // namespace

QuantShape quant_weight_shape(const char* op, const QuantWeightView& w) {
  QuantShape s;
  const bool i4 = w.format == WeightFormat::int4;
  OT_CHECK(w.format == WeightFormat::int8 || i4, op, "format", "int8 or int4", int(w.format));
  OT_CHECK(w.data.dtype == (i4 ? DType::u8 : DType::i8), op, "weight",
           i4 ? "u8 (two int4 codes a byte) for the int4 format" : "i8 codes for the int8 format", dtype_name(w.data.dtype));
  OT_CHECK(w.data.ndim == 3, op, "weight", "[G, K, N] codes", w.data.shape_str());
  s.G = w.data.size(0);
  s.K = w.data.size(1);
  OT_CHECK(w.scale.defined(), op, "antiquant_scale", "a float tensor ([G, N] or [G, K / group_size, N])", "none");
  OT_CHECK(is_float(w.scale.dtype), op, "antiquant_scale", "fp32, bf16 or fp16", dtype_name(w.scale.dtype));
  s.N = w.scale.ndim > 0 ? w.scale.size(-1) : 0;
  OT_CHECK(w.group_size == 0 || w.group_size == 32 || w.group_size == 64 || w.group_size == 128, op, "antiquant_group_size",
           "0 (per output channel), 32, 64 or 128", w.group_size);
  OT_CHECK(w.group_size == 0 || s.K % w.group_size == 0, op, "antiquant_group_size", detail::cat("a divisor of K = ", s.K), w.group_size);
  s.groups = w.group_size ? s.K / w.group_size : 1;
  s.group_len = w.group_size ? w.group_size : s.K;
  if (w.group_size)
    OT_CHECK(w.scale.ndim == 3 && w.scale.size(0) == s.G && w.scale.size(1) == s.groups, op, "antiquant_scale",
             detail::cat("[G, K / group_size, N] = [", s.G, ", ", s.groups, ", N]"), w.scale.shape_str());
  else
    OT_CHECK(w.scale.ndim == 2 && w.scale.size(0) == s.G, op, "antiquant_scale", detail::cat("[G, N] = [", s.G, ", N] (per output channel)"),
             w.scale.shape_str());
  OT_CHECK(w.scale.numel() > 0 || s.G * s.N == 0, op, "antiquant_scale", "a non-empty tensor", w.scale.shape_str());
  const int64_t packed = i4 ? (s.N + 1) / 2 : s.N;
  OT_CHECK(w.data.size(2) == packed, op, "weight",
           i4 ? detail::cat("[G, K, (N + 1) / 2] = [", s.G, ", ", s.K, ", ", packed, "] bytes for N = ", s.N, " (antiquant_scale's last dim)")
              : detail::cat("[G, K, N] with N = ", s.N, " (antiquant_scale's last dim)"),
           w.data.shape_str());
  OT_CHECK(all_finite(w.scale), op, "antiquant_scale", "finite values", "NaN or Inf");
  if (w.offset.defined()) {
    OT_CHECK(is_float(w.offset.dtype), op, "antiquant_offset", "fp32, bf16 or fp16", dtype_name(w.offset.dtype));
    OT_CHECK(w.offset.shape() == w.scale.shape(), op, "antiquant_offset", detail::cat("antiquant_scale's shape ", w.scale.shape_str()),
             w.offset.shape_str());
    OT_CHECK(all_finite(w.offset), op, "antiquant_offset", "finite values", "NaN or Inf");
  }
  return s;
}

QuantizedWeights quantize_weights_with(const TensorView& w0, const TensorView& scale, const TensorView& offset, WeightFormat f,
                                       int64_t group_size) {
  const char* op = "quantize_weights";
  TensorView w = as_3d(op, w0);
  const int64_t G = w.size(0), K = w.size(1), N = w.size(2);
  check_group_size(op, group_size, K);
  const int64_t groups = group_size ? K / group_size : 1;
  OT_CHECK(f == WeightFormat::int8 || f == WeightFormat::int4, op, "format", "int8 or int4", int(f));
  // The shape checks of the operators, on an empty code tensor of the right form.
  QuantWeightView qv{TensorView(nullptr, f == WeightFormat::int4 ? DType::u8 : DType::i8, {G, K, f == WeightFormat::int4 ? (N + 1) / 2 : N}),
                     scale, offset, f, group_size};
  OT_CHECK(scale.defined() && scale.ndim >= 1 && scale.size(-1) == N, op, "antiquant_scale", detail::cat("N = ", N, " columns (w's last dim)"),
           scale.shape_str());
  quant_weight_shape(op, qv);
  std::vector<float> s = read_f32(scale), o = offset.defined() ? read_f32(offset) : std::vector<float>();
  QuantizedWeights q;
  q.format = f;
  q.group_size = group_size;
  q.data = encode(w, s.data(), o.empty() ? nullptr : o.data(), f, groups);
  q.scale = f32_tensor(s, G, groups, N, group_size);
  if (!o.empty()) q.offset = f32_tensor(o, G, groups, N, group_size);
  return q;
}

QuantizedWeights quantize_weights(const TensorView& w0, WeightFormat f, int64_t group_size, bool symmetric) {
  const char* op = "quantize_weights";
  TensorView w = as_3d(op, w0);
  const int64_t G = w.size(0), K = w.size(1), N = w.size(2);
  check_group_size(op, group_size, K);
  OT_CHECK(f == WeightFormat::int8 || f == WeightFormat::int4, op, "format", "int8 or int4", int(f));
  const int64_t groups = group_size ? K / group_size : 1, len = group_size ? group_size : K;
  const Range r = range_of(f);
  std::vector<float> s(size_t(G * groups * N)), o(symmetric ? 0 : s.size());
  for (int64_t g = 0; g < G; ++g) {
    const std::vector<float> wg = expert_f32(w, g);
    for (int64_t j = 0; j < groups; ++j)
      for (int64_t n = 0; n < N; ++n) {
        float lo = 0, hi = 0, amax = 0;
        for (int64_t k = j * len; k < (j + 1) * len; ++k) {
          const float v = wg[size_t(k * N + n)];
          if (k == j * len) lo = hi = v;
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::fabs(v));
        }
        const size_t i = size_t((g * groups + j) * N + n);
        if (symmetric) {
          s[i] = amax / float(r.qmax);
        } else {
          float sc = (hi - lo) / float(r.qmax - r.qmin);
          if (!(sc > 0)) sc = lo != 0 ? std::fabs(lo) : 1.f;  // a constant group (K = 0 too)
          s[i] = sc;
          o[i] = lo / sc - float(r.qmin);
        }
      }
  }
  QuantizedWeights q;
  q.format = f;
  q.group_size = group_size;
  q.data = encode(w, s.data(), symmetric ? nullptr : o.data(), f, groups);
  q.scale = f32_tensor(s, G, groups, N, group_size);
  if (!symmetric) q.offset = f32_tensor(o, G, groups, N, group_size);
  return q;
}

Tensor dequantize_weights(const QuantWeightView& w) {
  quant_weight_shape("dequantize_weights", w);
  return refimpl::dequantize_weights(w);
}

}  // namespace ot
