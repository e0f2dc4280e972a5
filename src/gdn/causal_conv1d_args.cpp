// Shared argument checks and block packing of the causal conv1d operators.
#include "src/gdn/causal_conv1d_args.h"

#include <algorithm>
#include <cstring>

#include "ot/numeric.h"

#include "ot/error.h"
#include "src/gdn/gdn_internal.h"

namespace ot::gdn::detail::conv {
namespace {
float get(const TensorView& v, int64_t off) {
  const char* p = static_cast<const char*>(v.data) + off * int64_t(dtype_size(v.dtype));
  if (v.dtype == DType::f32) return *reinterpret_cast<const float*>(p);
  uint16_t h;
  std::memcpy(&h, p, 2);
  return v.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}
void put(const TensorView& v, int64_t off, float x) {
  char* p = static_cast<char*>(v.data) + off * int64_t(dtype_size(v.dtype));
  if (v.dtype == DType::f32) {
    *reinterpret_cast<float*>(p) = x;
    return;
  }
  uint16_t h = v.dtype == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
  std::memcpy(p, &h, 2);
}
}  // namespace

int64_t check_weight_bias(const TensorView& weight, const TensorView& bias, int64_t D, const char* op) {
  OT_CHECK(weight.defined() && weight.ndim == 2 && weight.sizes[0] == D, op, "weight",
           ::ot::detail::cat("[D, W] with D = ", D, " (x's channels)"), weight.shape_str());
  const int64_t W = weight.sizes[1];
  OT_CHECK(W >= 2 && W <= kMaxWidth, op, "weight", ::ot::detail::cat("a kernel width W in [2, ", kMaxWidth, "]"), "W = ", W);
  expect_float(weight.dtype, op, "weight");
  if (bias.defined()) {
    OT_CHECK(bias.ndim == 1 && bias.sizes[0] == D, op, "bias", ::ot::detail::cat("[D] with D = ", D), bias.shape_str());
    expect_float(bias.dtype, op, "bias");
  }
  return W;
}

void check_state(const TensorView& s, int64_t N, int64_t D, int64_t W, DType x_dtype, const char* op, const char* arg, bool any_float) {
  OT_CHECK(s.ndim == 3 && s.sizes[0] == N && s.sizes[1] == D && s.sizes[2] == W - 1, op, arg,
           ::ot::detail::cat("[N, D, W-1] = [", N, ", ", D, ", ", W - 1, "]"), s.shape_str());
  if (any_float) expect_float(s.dtype, op, arg);
  else
    OT_CHECK(s.dtype == x_dtype || s.dtype == DType::f32, op, arg, ::ot::detail::cat("x's dtype (", dtype_name(x_dtype), ") or fp32"),
             dtype_name(s.dtype));
}

PackedWeights pack_weights(const TensorView& weight, const TensorView& bias) {
  PackedWeights p;
  p.D = weight.sizes[0];
  p.W = weight.sizes[1];
  p.blocks = (p.D + kBlock - 1) / kBlock;
  p.w.assign(size_t(p.blocks * p.W * kBlock), 0.f);
  p.bias.assign(size_t(p.blocks * kBlock), 0.f);
  // Contiguous weights (the usual case) are widened in one pass: this runs on every decode step.
  std::vector<float> wf;
  if (weight.is_contiguous()) {
    wf.resize(size_t(p.D * p.W));
    convert_to_f32(weight.data, weight.dtype, wf.data(), p.D * p.W);
  }
  for (int64_t d = 0; d < p.D; ++d) {
    const int64_t blk = d / kBlock, c = d % kBlock;
    for (int64_t k = 0; k < p.W; ++k)
      p.w[size_t((blk * p.W + k) * kBlock + c)] = wf.empty() ? get(weight, d * weight.strides[0] + k * weight.strides[1]) : wf[size_t(d * p.W + k)];
    if (bias.defined()) p.bias[size_t(blk * kBlock + c)] = get(bias, d * bias.strides[0]);
  }
  return p;
}

void gather_state(const TensorView& s, int64_t n, int64_t c0, int64_t nc, int64_t W, float* dst) {
  std::fill(dst, dst + (W - 1) * kBlock, 0.f);
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t j = 0; j < W - 1; ++j) dst[j * kBlock + c] = get(s, n * s.strides[0] + (c0 + c) * s.strides[1] + j * s.strides[2]);
}
void scatter_state(const float* src, const TensorView& s, int64_t n, int64_t c0, int64_t nc, int64_t W) {
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t j = 0; j < W - 1; ++j) put(s, n * s.strides[0] + (c0 + c) * s.strides[1] + j * s.strides[2], src[j * kBlock + c]);
}

}  // namespace ot::gdn::detail::conv
