// causal_conv1d_update (ot/gdn_layer.h): the decode step of the short conv on a slot cache. The
// state of a channel is W-1 values in a row ([D, W-1] per slot): a channel block's states are read
// once into fp32, the S tokens run through the prefill kernel (causal_conv1d_kernels.inc) from them,
// and its final stream rows are written back; one job per (batch row, channel block).
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/gdn_layer.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
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
  const auto& kernels = seq_kernels();
  if (scope.active()) scope.args(x_in.shape_str()).kernel(cpu::force_ref() ? "ref" : kernels.name);
  if (cpu::force_ref()) {
    ref::causal_conv1d_update(x, conv_state, weight, o.bias, silu, slots, y3);
    return y;
  }
  const PackedWeights pw = pack_weights(weight, o.bias);
  const int64_t Wm = W - 1;
  // A slot's [D, W-1] slab in one piece: its channel block moves as one row.
  const bool slab = conv_state.strides[2] == 1 && conv_state.strides[1] == Wm;
  Tensor keep;
  const TensorView xc = x.strides[2] == 1 || D <= 1 ? x : (keep = Tensor::copy_of(x)).view();
  // The state read and written, x in and y out (a decode step's few KiB: on the calling thread).
  const double call_bytes = double(B * D) * double(2 * Wm * dtype_size(conv_state.dtype) + 2 * S * dtype_size(x.dtype));
  parallel_for_sized(B * pw.blocks, call_bytes, [&](int64_t j0, int64_t j1) {
    alignas(64) float zeros[kBlock] = {}, cw[kBlock * (kMaxWidth - 1)], init[kBlock * (kMaxWidth - 1)], fin[kBlock * (kMaxWidth - 1)];
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / pw.blocks, blk = j % pw.blocks, c0 = blk * kBlock;
      const Block k = pw.block(blk, silu);
      const int64_t slot = slots[size_t(b)];
      if (slot < 0) {
        for (int64_t t = 0; t < S; ++t) store_row(zeros, elem_at(y3.data, y3.dtype, b * y3.strides[0] + t * y3.strides[1] + c0), y3.dtype, k.nc);
        continue;
      }
      // The block's states channel-major (cw[c * (W-1) + i], as stored) and as the kernel's stream
      // rows (init[i * kBlock + c], oldest first).
      const int64_t s_off = slot * conv_state.strides[0] + c0 * conv_state.strides[1];
      if (slab) load_row(elem_at(conv_state.data, conv_state.dtype, s_off), conv_state.dtype, k.nc * Wm, cw);
      else
        for (int64_t c = 0; c < k.nc; ++c)
          for (int64_t i = 0; i < Wm; ++i)
            cw[c * Wm + i] = ld(elem_at(conv_state.data, conv_state.dtype, s_off + c * conv_state.strides[1] + i * conv_state.strides[2]),
                                conv_state.dtype);
      std::fill(init, init + Wm * kBlock, 0.f);
      for (int64_t c = 0; c < k.nc; ++c)
        for (int64_t i = 0; i < Wm; ++i) init[i * kBlock + c] = cw[c * Wm + i];
      FwdSeq q;
      q.x = {elem_at(xc.data, xc.dtype, b * xc.strides[0] + c0), xc.dtype, xc.strides[1]};
      q.y = {elem_at(y3.data, y3.dtype, b * y3.strides[0] + c0), y3.dtype, y3.strides[1]};
      q.len = S;
      q.init = init;
      q.fin = fin;
      kernels.fn.fwd_seq(k, q);
      for (int64_t c = 0; c < k.nc; ++c)
        for (int64_t i = 0; i < Wm; ++i) cw[c * Wm + i] = fin[i * kBlock + c];
      if (slab) store_row(cw, elem_at(conv_state.data, conv_state.dtype, s_off), conv_state.dtype, k.nc * Wm);
      else
        for (int64_t c = 0; c < k.nc; ++c)
          for (int64_t i = 0; i < Wm; ++i)
            st(elem_at(conv_state.data, conv_state.dtype, s_off + c * conv_state.strides[1] + i * conv_state.strides[2]), conv_state.dtype,
               cw[c * Wm + i]);
    }
  });
  return y;
}

}  // namespace ot::gdn
