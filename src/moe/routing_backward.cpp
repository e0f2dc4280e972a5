// Backward of the routing operators: permute / unpermute, init routing v1/v2, finalize. All are
// row gathers in the reverse direction, parallel over tokens (destinations are checked distinct,
// so no two tokens write the same row), fp32 accumulation over the token's k rows.
#include <cstring>
#include <vector>

#include "ot/cpu.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
#include "src/moe/bwd_common.h"

namespace ot::moe {

namespace {

// out[t] = sum_k src[dst_of(t, k)] over valid destinations (0 <= d < P), rows in fp32.
template <class F> Tensor gather_sum(const TensorView& src, int64_t T, int64_t K, int64_t H, int64_t P, F dst_of) {
  Tensor out = Tensor::empty(src.dtype, {T, H});
  bwd::parallel_rows(T, K * H, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(H)), r(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = dst_of(t, k);
        if (d < 0 || d >= P) continue;
        convert_to_f32(row_at(src, H, d), src.dtype, r.data(), H);
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += r[size_t(h)];
      }
      convert_from_f32(acc.data(), row_at(out, H, t), out.dtype(), H);
    }
  });
  return out;
}
}  // namespace

Tensor moe_token_permute_backward(const TensorView& dp, const TensorView& si, int64_t topk) {
  auto p = bwd::plan_permute_backward("moe_token_permute_backward", dp, si, topk);
  if (cpu::force_ref()) return ref::moe_token_permute_backward(dp, si, topk);
  trace::OpScope scope("moe_token_permute_backward");
  if (scope.active()) scope.kernel("gather").args(dp.shape_str());
  scope.bytes(2.0 * double(dp.nbytes()));
  const int32_t* s = si.ptr<int32_t>();
  return gather_sum(dp, p.T, p.K, p.H, p.P, [&](int64_t t, int64_t k) { return s[t * p.K + k]; });
}

Tensor moe_init_routing_v2_backward(const TensorView& dex, const TensorView& idx, int64_t N, int64_t K, int type) {
  auto p = bwd::plan_init_routing_backward("moe_init_routing_v2_backward", dex, idx, N, K, type);
  if (cpu::force_ref()) return ref::moe_init_routing_v2_backward(dex, idx, N, K, type);
  trace::OpScope scope("moe_init_routing_v2_backward");
  if (scope.active()) scope.kernel("gather").args(dex.shape_str());
  scope.bytes(2.0 * double(dex.nbytes()));
  TensorView rows = dex.reshape({p.P, p.H});
  const int32_t* s = idx.ptr<int32_t>();
  if (type == 0) return gather_sum(rows, N, K, p.H, p.P, [&](int64_t t, int64_t k) { return s[t * K + k]; });
  std::vector<int32_t> dst(static_cast<size_t>(N * K), -1);  // scatter form: invert dst -> src first
  for (int64_t i = 0; i < p.P; ++i) dst[size_t(s[i])] = int32_t(i);
  return gather_sum(rows, N, K, p.H, p.P, [&](int64_t t, int64_t k) { return dst[size_t(t * K + k)]; });
}

Tensor moe_init_routing_backward(const TensorView& dex, const TensorView& idx, int64_t N, int64_t K) {
  auto p = bwd::plan_init_routing_backward("moe_init_routing_backward", dex, idx, N, K, 0);
  if (cpu::force_ref()) return ref::moe_init_routing_backward(dex, idx, N, K);
  trace::OpScope scope("moe_init_routing_backward");
  if (scope.active()) scope.kernel("gather").args(dex.shape_str());
  scope.bytes(2.0 * double(dex.nbytes()));
  const int32_t* s = idx.ptr<int32_t>();
  return gather_sum(dex, N, K, p.H, p.P, [&](int64_t t, int64_t k) { return s[k * N + t]; });
}

TokenUnpermuteGrads moe_token_unpermute_backward(const TensorView& dout, const TensorView& permuted, const TensorView& si,
                                                 const TensorView& probs) {
  auto p = bwd::plan_unpermute_backward("moe_token_unpermute_backward", dout, permuted, si, probs);
  if (cpu::force_ref()) return ref::moe_token_unpermute_backward(dout, permuted, si, probs);
  trace::OpScope scope("moe_token_unpermute_backward");
  if (scope.active()) scope.kernel("scatter").args(permuted.shape_str());
  scope.bytes(3.0 * double(permuted.nbytes()));
  const int64_t T = p.T, K = p.K, H = p.H, P = p.P;
  TokenUnpermuteGrads g;
  g.d_permuted = Tensor::zeros(permuted.dtype, {P, H});
  if (probs.defined()) g.d_probs = Tensor::zeros(DType::f32, {T, K});
  const int32_t* s = si.ptr<int32_t>();
  bwd::parallel_rows(T, K * H, [&](int64_t t0, int64_t t1) {
    std::vector<float> go(static_cast<size_t>(H)), r(static_cast<size_t>(H)), pr(static_cast<size_t>(K), 1.f);
    for (int64_t t = t0; t < t1; ++t) {
      convert_to_f32(row_at(dout, H, t), dout.dtype, go.data(), H);
      if (probs.defined()) convert_to_f32(row_at(probs, probs.strides[0], t), probs.dtype, pr.data(), K);
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = s[t * K + k];
        if (d < 0 || d >= P) continue;
        if (probs.defined()) {
          convert_to_f32(row_at(permuted, H, d), permuted.dtype, r.data(), H);
          double dot = 0;
          for (int64_t h = 0; h < H; ++h) dot += double(go[size_t(h)]) * r[size_t(h)];
          g.d_probs.ptr<float>()[t * K + k] = float(dot);
        }
        for (int64_t h = 0; h < H; ++h) r[size_t(h)] = pr[size_t(k)] * go[size_t(h)];
        convert_from_f32(r.data(), row_at(g.d_permuted, H, d), permuted.dtype, H);
      }
    }
  });
  return g;
}

FinalizeRoutingGrads moe_finalize_routing_v2_backward(const TensorView& dout, const TensorView& ex, const TensorView& idx, const TensorView& scales,
                                                      const TensorView& bias, const TensorView& expert_idx, int mode) {
  auto p = bwd::plan_finalize_backward("moe_finalize_routing_v2_backward", dout, ex, idx, scales, bias, expert_idx, mode);
  if (cpu::force_ref()) return ref::moe_finalize_routing_v2_backward(dout, ex, idx, scales, bias, expert_idx, mode);
  trace::OpScope scope("moe_finalize_routing_v2_backward");
  if (scope.active()) scope.kernel("scatter").args(ex.shape_str());
  scope.bytes(3.0 * double(ex.nbytes()));
  const int64_t N = p.T, K = p.K, H = p.H;
  const bool col = mode == 0 || mode == 1;
  const int32_t* d_of = idx.ptr<int32_t>();
  const int32_t* e_of = bias.defined() ? expert_idx.ptr<int32_t>() : nullptr;
  auto pos = [&](int64_t n, int64_t k) { return col ? k * N + n : n * K + k; };
  auto scale = [&](int64_t n, int64_t k) { return scales.defined() ? float(get_as_double(scales, n * K + k)) : 1.f; };
  FinalizeRoutingGrads g;
  g.d_expanded_x = Tensor::zeros(ex.dtype, ex.shape());
  if (scales.defined()) g.d_scales = Tensor::empty(DType::f32, {N, K});
  bwd::parallel_rows(N, K * H, [&](int64_t n0, int64_t n1) {
    std::vector<float> go(static_cast<size_t>(H)), r(static_cast<size_t>(H)), b(static_cast<size_t>(H));
    for (int64_t n = n0; n < n1; ++n) {
      convert_to_f32(row_at(dout, H, n), dout.dtype, go.data(), H);
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = d_of[pos(n, k)];
        float s = scale(n, k);
        if (scales.defined()) {
          if (d >= 0) convert_to_f32(row_at(ex, H, d), ex.dtype, r.data(), H);
          else std::fill(r.begin(), r.end(), 0.f);
          if (e_of) {
            convert_to_f32(row_at(bias, H, e_of[n * K + k]), bias.dtype, b.data(), H);
            for (int64_t h = 0; h < H; ++h) r[size_t(h)] += b[size_t(h)];
          }
          double dot = 0;
          for (int64_t h = 0; h < H; ++h) dot += double(go[size_t(h)]) * r[size_t(h)];
          g.d_scales.ptr<float>()[n * K + k] = float(dot);
        }
        if (d < 0) continue;
        for (int64_t h = 0; h < H; ++h) r[size_t(h)] = s * go[size_t(h)];
        convert_from_f32(r.data(), row_at(g.d_expanded_x, H, d), ex.dtype, H);
      }
    }
  });
  if (bias.defined()) {  // experts shared by many tokens: split over columns instead of tokens
    g.d_bias = Tensor::zeros(DType::f32, {p.E, H});
    bwd::parallel_rows(H, N * K, [&](int64_t h0, int64_t h1) {
      std::vector<float> go(static_cast<size_t>(H));
      float* db = g.d_bias.ptr<float>();
      for (int64_t n = 0; n < N; ++n) {
        convert_to_f32(elem_at(dout.data, dout.dtype, n * H + h0), dout.dtype, go.data(), h1 - h0);
        for (int64_t k = 0; k < K; ++k) {
          float s = scale(n, k);
          float* dst = db + e_of[n * K + k] * H;
          for (int64_t h = h0; h < h1; ++h) dst[h] += s * go[size_t(h - h0)];
        }
      }
    });
  }
  return g;
}

}  // namespace ot::moe
