// causal_conv1d_update (ot/gdn_layer.h): the decode step of the short conv on a slot cache. The
// state of a channel is W-1 values in a row ([D, W-1] per slot), read once and written once per call;
// one job per (batch row, channel block).
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/gdn_layer.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/causal_conv1d_args.h"
#include "src/gdn/gdn_internal.h"
#include "src/gdn/layer_row_math_generic.h"
#include "src/ref/gdn_layer_ref.h"

namespace ot::gdn {
using namespace detail;
using namespace detail::conv;

namespace {

// x as [B, S, D] (a 2-D [B, D] is one token per row).
TensorView as_tokens(const TensorView& v) {
  if (v.ndim == 3) return v;
  return TensorView(v.data, v.dtype, {v.sizes[0], 1, v.sizes[1]}, {v.strides[0], v.strides[0], v.strides[1]});
}

std::vector<int64_t> check_slots(const TensorView& idx, int64_t B, int64_t slots, const char* op) {
  std::vector<int64_t> s(static_cast<size_t>(B), 0);
  if (!idx.defined()) {
    OT_CHECK(slots == B, op, "conv_state", ::ot::detail::cat("one slot per row (", B, ") without conv_state_indices"), slots, " slots");
    for (int64_t b = 0; b < B; ++b) s[size_t(b)] = b;
    return s;
  }
  OT_CHECK(idx.ndim == 1 && idx.sizes[0] == B, op, "conv_state_indices", ::ot::detail::cat("[B] with B = ", B), idx.shape_str());
  OT_CHECK(idx.dtype == DType::i32 || idx.dtype == DType::i64, op, "conv_state_indices", "int32 (or int64)", dtype_name(idx.dtype));
  std::vector<char> used(size_t(slots), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t off = b * idx.strides[0];
    const int64_t v = idx.dtype == DType::i32 ? int64_t(idx.ptr<int32_t>()[off]) : idx.ptr<int64_t>()[off];
    OT_CHECK(v < slots, op, "conv_state_indices", ::ot::detail::cat("slots in [0, ", slots, ") or negative (padded row)"),
             "conv_state_indices[", b, "] = ", v);
    if (v >= 0) {
      OT_CHECK(!used[size_t(v)], op, "conv_state_indices", "distinct slots (two rows would race on one state)", "slot ", v, " twice");
      used[size_t(v)] = 1;
    }
    s[size_t(b)] = v;
  }
  return s;
}

float ld(const char* p, DType t) {
  if (t == DType::f32) return *reinterpret_cast<const float*>(p);
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}
void st(char* p, DType t, float v) {
  if (t == DType::f32) {
    *reinterpret_cast<float*>(p) = v;
    return;
  }
  uint16_t h = t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

}  // namespace

Tensor causal_conv1d_update(const TensorView& x_in, const TensorView& conv_state, const TensorView& weight,
                            const CausalConv1dUpdateOptions& o) {
  const char* op = "causal_conv1d_update";
  trace::OpScope scope(op);
  OT_CHECK(x_in.defined() && (x_in.ndim == 2 || x_in.ndim == 3), op, "x", "[B, D] or [B, S, D]", x_in.shape_str());
  expect_float(x_in.dtype, op, "x");
  const TensorView x = as_tokens(x_in);
  const int64_t B = x.sizes[0], S = x.sizes[1], D = x.sizes[2];
  const int64_t W = check_weight_bias(weight, o.bias, D, op);
  OT_CHECK(o.activation == Activation::none || o.activation == Activation::silu, op, "activation", "none or silu", int(o.activation));
  OT_CHECK(conv_state.defined() && conv_state.ndim == 3, op, "conv_state", "[num_slots, D, W-1]", conv_state.shape_str());
  check_state(conv_state, conv_state.sizes[0], D, W, x.dtype, op, "conv_state");
  const std::vector<int64_t> slots = check_slots(o.conv_state_indices, B, conv_state.sizes[0], op);
  const bool silu = o.activation == Activation::silu;

  Tensor y = Tensor::empty(x.dtype, x_in.shape());
  const TensorView y3 = as_tokens(y.view());
  if (scope.active()) scope.args(x_in.shape_str()).kernel(cpu::force_ref() ? "ref" : "generic");
  if (cpu::force_ref()) {
    ref::causal_conv1d_update(x, conv_state, weight, o.bias, silu, slots, y3);
    return y;
  }
  const PackedWeights pw = pack_weights(weight, o.bias);
  const int64_t xs = int64_t(dtype_size(x.dtype)), ss = int64_t(dtype_size(conv_state.dtype));
  parallel_for(B * pw.blocks, [&](int64_t j0, int64_t j1) {
    alignas(64) float out[kBlock];
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / pw.blocks, blk = j % pw.blocks, c0 = blk * kBlock;
      const Block k = pw.block(blk, silu);
      const int64_t slot = slots[size_t(b)];
      for (int64_t t = 0; t < S; ++t) {
        char* yrow = elem_at(y3.data, y3.dtype, b * y3.strides[0] + t * y3.strides[1] + c0);
        if (slot < 0) {
          std::fill(out, out + kBlock, 0.f);
          store_row(out, yrow, y3.dtype, k.nc);
          continue;
        }
        const char* xrow = static_cast<const char*>(x.data) + (b * x.strides[0] + t * x.strides[1] + c0 * x.strides[2]) * xs;
        for (int64_t c = 0; c < k.nc; ++c) {
          char* s = static_cast<char*>(conv_state.data) + (slot * conv_state.strides[0] + (c0 + c) * conv_state.strides[1]) * ss;
          const int64_t sj = conv_state.strides[2] * ss;
          float win[kMaxWidth];
          for (int64_t i = 0; i < W - 1; ++i) win[i] = ld(s + i * sj, conv_state.dtype);
          win[W - 1] = ld(xrow + c * x.strides[2] * xs, x.dtype);
          float acc = k.bias[c];
          for (int64_t i = 0; i < W; ++i) acc += k.w[i * kBlock + c] * win[i];
          out[c] = acc;
          for (int64_t i = 0; i < W - 1; ++i) st(s + i * sj, conv_state.dtype, win[i + 1]);
        }
        if (silu) silu_row(out, k.nc);
        store_row(out, yrow, y3.dtype, k.nc);
      }
    }
  });
  return y;
}

}  // namespace ot::gdn
