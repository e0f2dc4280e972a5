// Routing references: the spec's pseudo-code, literally (std::stable_sort on the spec's keys,
// element-wise copies through get_as_double / set_from_double).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "src/moe/common.h"
#include "src/moe/routing_plan.h"

namespace ot::moe::impl {

static std::vector<int64_t> stable_order(const std::vector<int64_t>& key) {
  std::vector<int64_t> perm(key.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return key[size_t(a)] < key[size_t(b)]; });
  return perm;
}
static void copy_row(const TensorView& src, int64_t srow, const TensorView& dst, int64_t drow, int64_t H) {
  for (int64_t h = 0; h < H; ++h) set_from_double(dst, drow * H + h, get_as_double(src, srow * H + h));
}

void init_v1_ref(const InitV1Plan& p, InitRoutingResult& r) {
  std::vector<int64_t> key(static_cast<size_t>(p.N * p.K));
  for (size_t j = 0; j < key.size(); ++j) key[j] = p.expert_idx.ptr<int32_t>()[j];
  std::vector<int64_t> perm = stable_order(key);
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t src = p.row_idx.ptr<int32_t>()[perm[i]];
    r.expanded_row_idx.ptr<int32_t>()[src] = int32_t(i);
    r.expanded_expert_idx.ptr<int32_t>()[i] = int32_t(key[size_t(perm[i])]);
    if (int64_t(i) < p.active_tokens * p.K) copy_row(p.x, src % p.N, r.expanded_x, int64_t(i), p.H);
  }
}

InitRoutingV2Result init_v2_ref(const InitV2Plan& p) {
  const int64_t NK = p.N * p.K, s = p.start, e_ = p.end;
  std::vector<int64_t> key(static_cast<size_t>(NK));
  int64_t available = 0;
  for (int64_t j = 0; j < NK; ++j) {
    int64_t id = p.expert_idx.ptr<int32_t>()[j];
    key[size_t(j)] = id < s ? std::numeric_limits<int32_t>::max() : id;
    available += id >= s && id < e_;
  }
  std::vector<int64_t> perm = stable_order(key);
  InitRoutingV2Result r;
  r.available = available;
  bool quant = p.o.quant_mode >= 0, want_scale = p.o.quant_mode == 1 || p.scale == InitV2Plan::Scale::per_token;
  DType xt = quant ? DType::i8 : p.x.dtype;
  std::vector<int64_t> counts(static_cast<size_t>(e_ - s), 0);
  for (int64_t i = 0; i < available; ++i) ++counts[size_t(key[size_t(perm[size_t(i)])] - s)];
  std::vector<int64_t> dst(static_cast<size_t>(NK), -1);
  if (p.o.drop_pad_mode == 1) {
    std::vector<int64_t> slot(static_cast<size_t>(p.E), 0);
    for (int64_t i = 0; i < available; ++i) {
      int64_t e = key[size_t(perm[size_t(i)])];
      if (slot[size_t(e)] < p.C) dst[size_t(i)] = e * p.C + slot[size_t(e)]++; else ++r.dropped;
    }
    r.expanded_x = Tensor::zeros(xt, {p.E, p.C, p.H});
    if (want_scale) r.expanded_scale = Tensor::zeros(DType::f32, {p.E * p.C});
    r.expert_tokens = Tensor::empty(DType::i64, {p.E});
    for (int64_t e = 0; e < p.E; ++e) r.expert_tokens.ptr<int64_t>()[e] = counts[size_t(e)];
  } else {
    int64_t rows = p.o.active_num > 0 ? std::min(p.o.active_num, available) : available;
    r.dropped = available - rows;
    for (int64_t i = 0; i < rows; ++i) dst[size_t(i)] = i;
    r.expanded_x = Tensor::zeros(xt, {rows, p.H});
    if (want_scale) r.expanded_scale = Tensor::zeros(DType::f32, {rows});
    if (p.o.expert_tokens_num_type == 2) {
      r.expert_tokens = Tensor::zeros(DType::i64, {p.E, 2});
      int64_t n = 0;
      for (int64_t e = s; e < e_; ++e)
        if (counts[size_t(e - s)] > 0) {
          r.expert_tokens.ptr<int64_t>()[2 * n] = e;
          r.expert_tokens.ptr<int64_t>()[2 * n + 1] = counts[size_t(e - s)];
          ++n;
        }
    } else {
      r.expert_tokens = Tensor::empty(DType::i64, {e_ - s});
      int64_t run = 0;
      for (int64_t e = 0; e < e_ - s; ++e) {
        run += counts[size_t(e)];
        r.expert_tokens.ptr<int64_t>()[e] = p.o.expert_tokens_num_type == 0 ? run : counts[size_t(e)];
      }
    }
  }
  r.expanded_row_idx = Tensor::empty(DType::i32, {NK});
  int32_t* eri = r.expanded_row_idx.ptr<int32_t>();
  for (int64_t j = 0; j < NK; ++j) eri[j] = -1;
  for (int64_t i = 0; i < available; ++i) {
    if (p.o.row_idx_type == 1) eri[i] = int32_t(perm[size_t(i)]);
    else eri[perm[size_t(i)]] = int32_t(p.o.drop_pad_mode == 1 ? dst[size_t(i)] : i);
  }
  std::vector<float> xs(static_cast<size_t>(p.H));
  for (int64_t i = 0; i < available; ++i) {
    int64_t d = dst[size_t(i)];
    if (d < 0) continue;
    int64_t n = perm[size_t(i)] / p.K, e = key[size_t(perm[size_t(i)])];
    if (!quant) {
      copy_row(p.x, n, r.expanded_x, d, p.H);
      if (p.scale == InitV2Plan::Scale::per_token) r.expanded_scale.ptr<float>()[d] = p.smooth.ptr<float>()[n];
      continue;
    }
    int8_t* q = r.expanded_x.ptr<int8_t>() + d * p.H;
    for (int64_t h = 0; h < p.H; ++h) xs[size_t(h)] = float(get_as_double(p.x, n * p.H + h));
    if (p.o.quant_mode == 0) {
      for (int64_t h = 0; h < p.H; ++h) q[h] = quant_i8(xs[size_t(h)] * p.static_scale + p.static_offset);
      continue;
    }
    for (int64_t h = 0; h < p.H; ++h) {
      if (p.scale == InitV2Plan::Scale::smooth_one) xs[size_t(h)] *= p.smooth.ptr<float>()[h];
      if (p.scale == InitV2Plan::Scale::smooth_expert) xs[size_t(h)] *= p.smooth.ptr<float>()[(e - s) * p.H + h];
    }
    float amax = 0;
    bool finite = true;
    for (float v : xs) { amax = std::max(amax, std::fabs(v)); finite = finite && std::isfinite(v); }
    float dq = finite ? amax / 127.f : std::nanf("");  // a NaN / Inf row: scale NaN, codes 0 (ot/quant.h)
    for (int64_t h = 0; h < p.H; ++h) q[h] = dq > 0 ? quant_i8(xs[size_t(h)] / dq) : 0;
    r.expanded_scale.ptr<float>()[d] = dq;
  }
  return r;
}

void permute_ref(const PermutePlan& p, TokenPermuteResult& r) {
  if (p.padded) {
    for (int64_t i = 0; i < p.experts * p.cap; ++i) {
      int32_t t = p.indices.ptr<int32_t>()[i];
      r.sorted_indices.ptr<int32_t>()[i] = t;
      copy_row(p.tokens, t, r.permuted_tokens, i, p.H);
    }
    return;
  }
  std::vector<int64_t> key(static_cast<size_t>(p.T * p.K));
  for (size_t j = 0; j < key.size(); ++j) key[j] = p.indices.ptr<int32_t>()[j];
  std::vector<int64_t> perm = stable_order(key);
  for (size_t i = 0; i < perm.size(); ++i) {
    r.sorted_indices.ptr<int32_t>()[perm[i]] = int32_t(i);
    if (int64_t(i) < p.rows) copy_row(p.tokens, perm[i] / p.K, r.permuted_tokens, int64_t(i), p.H);
  }
}

void unpermute_ref(const UnpermutePlan& p, const TensorView& out) {
  std::vector<double> acc(static_cast<size_t>(p.T * p.H), 0.0);
  const int32_t* idx = p.sorted.ptr<int32_t>();
  if (p.padded) {
    for (int64_t i = 0; i < p.P; ++i) {
      double w = p.probs.defined() ? get_as_double(p.probs, i) : 1.0;
      for (int64_t h = 0; h < p.H; ++h) acc[size_t(idx[i] * p.H + h)] += w * get_as_double(p.permuted, i * p.H + h);
    }
  } else {
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t k = 0; k < p.K; ++k) {
        int64_t d = idx[t * p.K + k];
        double w = p.probs.defined() ? get_as_double(p.probs, t * p.K + k) : 1.0;
        if (d < 0 || d >= p.P || w == 0.0) continue;
        for (int64_t h = 0; h < p.H; ++h) acc[size_t(t * p.H + h)] += w * get_as_double(p.permuted, d * p.H + h);
      }
  }
  for (size_t i = 0; i < acc.size(); ++i) set_from_double(out, int64_t(i), acc[i]);
}

}  // namespace ot::moe::impl

namespace ot::moe::impl {

void compute_expert_tokens_ref(const std::vector<int64_t>& v, int64_t E, int32_t* out) {
  for (int64_t e = 0; e < E; ++e) {
    int32_t n = 0;
    for (int64_t id : v) n += id <= e;
    out[e] = n;
  }
}

ReRoutingResult re_routing_ref(const TensorView& tokens, const std::vector<int64_t>& cnt, int64_t R, int64_t El, const TensorView& scales) {
  int64_t A = tokens.size(0), H = tokens.size(1);
  ReRoutingResult r;
  r.permute_tokens = Tensor::empty(tokens.dtype, {A, H});
  r.permute_token_idx = Tensor::empty(DType::i32, {A});
  r.expert_token_num = Tensor::zeros(DType::i64, {El});
  if (scales.defined()) r.permute_per_token_scales = Tensor::empty(DType::f32, {A});
  auto c = [&](int64_t i, int64_t j) { return cnt[size_t(i * El + j)]; };
  size_t es = dtype_size(tokens.dtype);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < El; ++j) {
      int64_t src = 0, dst = 0;
      for (int64_t i2 = 0; i2 < R; ++i2) for (int64_t j2 = 0; j2 < El; ++j2) if (i2 < i || (i2 == i && j2 < j)) src += c(i2, j2);
      for (int64_t j2 = 0; j2 < El; ++j2) for (int64_t i2 = 0; i2 < R; ++i2) if (j2 < j || (j2 == j && i2 < i)) dst += c(i2, j2);
      for (int64_t x = 0; x < c(i, j); ++x) {
        for (size_t b = 0; b < size_t(H) * es; ++b)
          static_cast<char*>(r.permute_tokens.view().data)[size_t(dst + x) * size_t(H) * es + b] =
              static_cast<const char*>(tokens.data)[size_t(src + x) * size_t(H) * es + b];
        r.permute_token_idx.ptr<int32_t>()[dst + x] = int32_t(src + x);
        if (scales.defined()) r.permute_per_token_scales.ptr<float>()[dst + x] = scales.ptr<float>()[src + x];
      }
      r.expert_token_num.ptr<int64_t>()[j] += c(i, j);
    }
  return r;
}

}  // namespace ot::moe::impl
