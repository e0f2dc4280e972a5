// Plain single-process reference of dispatch and combine, written from spec section 9.2/9.3 as
// loops a reader can check by eye. (It lives in libot_ep, not src/ref/, because it uses the
// Placement type and libot is built without MPI.)
#include <cmath>

#include "ot/ep.h"
#include "ot/numeric.h"
#include "src/core/elem_at.h"
#include "src/ep/internal.h"

namespace ot::ep::ref {

static int32_t id_at(const RankInput& in, int64_t t, int64_t k) { return in.expert_ids.ptr<int32_t>()[t * in.expert_ids.stride(0) + k]; }
static float w_at(const RankInput& in, int64_t t, int64_t k) {
  return in.expert_scales.defined() ? in.expert_scales.ptr<float>()[t * in.expert_scales.stride(0) + k] : 1.f;
}

RankExpand dispatch(const std::vector<RankInput>& ranks, const Placement& p, int q, bool quant, const TensorView& smooth,
                    int shared_expert_num) {
  const int W = int(ranks.size());
  const int64_t H = ranks[0].x.size(1), K = ranks[0].expert_ids.size(1);
  const DType dt = ranks[0].x.dtype;
  const auto& local = p.local_experts(q);
  // Count rows first, then fill: for l, for r, for t ascending.
  RankExpand out;
  std::vector<std::pair<int, int64_t>> rows;  // (r, t) per row
  std::vector<int32_t> ks;
  std::vector<int64_t> es;  // expert per row
  for (int64_t e : local) {
    int64_t n = 0;
    for (int r = 0; r < W; ++r)
      for (int64_t t = 0; t < ranks[size_t(r)].x.size(0); ++t)
        for (int64_t k = 0; k < K; ++k)
          if (id_at(ranks[size_t(r)], t, k) == e && p.destination(r, t, e) == q) {
            rows.push_back({r, t});
            ks.push_back(int32_t(k));
            es.push_back(e);
            ++n;
          }
    out.tokens_per_expert.push_back(n);
  }
  const int64_t A = int64_t(rows.size());
  out.expand_x = Tensor::empty(quant ? DType::i8 : dt, {A, H});
  if (quant) out.dynamic_scales = Tensor::empty(DType::f32, {A});
  std::vector<float> v(static_cast<size_t>(H));
  for (int64_t i = 0; i < A; ++i) {
    auto [r, t] = rows[size_t(i)];
    const TensorView& x = ranks[size_t(r)].x;
    const char* src = row_at(x, t);
    out.assist.insert(out.assist.end(), {int32_t(r), int32_t(t), ks[size_t(i)]});
    if (!quant) {
      std::memcpy(row_at(out.expand_x, i), src, size_t(H) * dtype_size(dt));
      continue;
    }
    for (int64_t h = 0; h < H; ++h) v[size_t(h)] = float(get_as_double(x, t * H + h));
    if (smooth.defined())  // per (token, expert): xs = x * scales[e + shared_expert_num]
      for (int64_t h = 0; h < H; ++h) v[size_t(h)] *= smooth.ptr<float>()[(es[size_t(i)] + shared_expert_num) * smooth.stride(0) + h];
    float amax = 0;
    for (float a : v) amax = std::max(amax, std::fabs(a));
    float d = amax / 127.f;
    int8_t* dst = reinterpret_cast<int8_t*>(out.expand_x.ptr<uint8_t>() + i * H);
    for (int64_t h = 0; h < H; ++h) dst[h] = int8_t(d > 0 ? std::min(127.f, std::max(-128.f, std::nearbyint(v[size_t(h)] / d))) : 0.f);
    out.dynamic_scales.ptr<float>()[i] = d;
  }
  return out;
}

void combine(const std::vector<RankInput>& ranks, const Placement& p, const std::vector<TensorView>& expert_out, int r, const TensorView& out) {
  const int W = int(ranks.size());
  const RankInput& in = ranks[size_t(r)];
  const int64_t BS = in.x.size(0), H = in.x.size(1), K = in.expert_ids.size(1);
  // Where each (r, t, k) landed: search every rank's rows in expand order (same loops as dispatch).
  std::vector<std::pair<int, int64_t>> where(size_t(BS * K), {-1, -1});
  for (int q = 0; q < W; ++q) {
    int64_t i = 0;
    for (int64_t e : p.local_experts(q))
      for (int s = 0; s < W; ++s)
        for (int64_t t = 0; t < ranks[size_t(s)].x.size(0); ++t)
          for (int64_t k = 0; k < K; ++k)
            if (id_at(ranks[size_t(s)], t, k) == e && p.destination(s, t, e) == q) {
              if (s == r) where[size_t(t * K + k)] = {q, i};
              ++i;
            }
  }
  for (int64_t t = 0; t < BS; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        auto [q, i] = where[size_t(t * K + k)];
        acc += w_at(in, t, k) * float(get_as_double(expert_out[size_t(q)], i * H + h));
      }
      set_from_double(out, t * H + h, double(acc));
    }
}

}  // namespace ot::ep::ref
