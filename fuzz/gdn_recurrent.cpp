// recurrent_gated_delta_rule (decode / speculative verification): state in/out or a caller-owned
// state cache (fp32 / bf16, guarded, updated in place) with per-sequence or per-token slots,
// accepted-token counts, fused gates (A_log, dt_bias, beta_sigmoid), g / beta absent, cu_seqlens,
// layouts, against the fp64 step of the OT_FORCE_REF path on a copy of the cache.
#include "fuzz/gdn_inputs.h"
#include "ot/cpu.h"

using namespace ot;
using namespace ot::gdn;

OT_FUZZ_TARGET(in, ar) {
  const fz::GdnShape s = fz::gdn_shape(in, 8);
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
  const double ks = 1.0 / std::sqrt(double(std::max<int64_t>(s.DK, 1)));
  fz::Buf& q = fz::gdn_vec(in, ar, "q", t, s.vec(s.HK, s.DK), ks);
  fz::Buf& k = fz::gdn_vec(in, ar, "k", t, s.vec(s.HK, s.DK), ks);
  fz::Buf& v = fz::gdn_vec(in, ar, "v", t, s.vec(s.HV, s.DV), 0.25);
  RecurrentOptions o;
  o.layout = s.layout;
  if (s.varlen) o.cu_seqlens = fz::cu_seqlens(in, ar, s);
  const bool fused = in.byte() < 64;
  o.beta_sigmoid = in.byte() < 64;
  TensorView g, beta;
  if (fused || in.byte() < 230) g = fz::gdn_scal(in, ar, "g", in.pick({DType::f32, DType::bf16}), s.scal(s.HV), fused ? -2 : -1, fused ? 2 : 0);
  if (o.beta_sigmoid || in.byte() < 230)
    beta = fz::gdn_scal(in, ar, "beta", in.pick({DType::f32, DType::bf16}), s.scal(s.HV), o.beta_sigmoid ? -4 : 0, o.beta_sigmoid ? 4 : 1);
  if (fused) {
    o.A_log = ar.values(in, "A_log", DType::f32, {in.byte() < 250 ? s.HV : s.HV + 1}, 0, 0.25);
    o.dt_bias = ar.values(in, "dt_bias", in.byte() < 250 ? DType::f32 : DType::bf16, {s.HV}, 0, 0.5);
  }
  o.use_qk_l2norm_in_kernel = in.flag();
  if (in.flag()) o.scale = in.pick({0.5f, 1.f, 0.125f});
  const int64_t N = std::max<int64_t>(s.seqs(), 0);
  const bool cache = in.flag();
  fz::Buf *cache_fast = nullptr, *cache_ref = nullptr;
  bool per_token = false;
  if (cache) {
    const int64_t slots = in.range(0, 2 * N + 3);
    const DType ct = in.pick({DType::f32, DType::bf16, DType::f32, DType::f16});
    cache_fast = &ar.values(in, "state_cache", ct, {slots, s.HV, s.DK, s.DV}, 0, 0.25);
    cache_ref = &ar.add("state_cache (reference copy)", ct, {slots, s.HV, s.DK, s.DV});
    std::memcpy(cache_ref->data(), cache_fast->data(), cache_fast->bytes());
    o.state_cache = *cache_fast;
    // Slots: mostly distinct and in range, -1 (not written) sometimes, rarely out of range.
    per_token = in.byte() < 100;
    const int64_t n_idx = per_token ? s.B * s.T : N;
    fz::Buf& si = ar.add("state_indices", in.byte() < 252 ? DType::i32 : DType::i64, {n_idx});
    std::vector<int64_t> pool;
    for (int64_t i = 0; i < slots; ++i) pool.push_back(i);
    for (int64_t i = 0; i < n_idx; ++i) {
      int64_t sl;
      if (in.byte() < 20) sl = in.byte() < 240 ? -1 : in.pick<int64_t>({slots, -2});
      else if (!pool.empty() && in.byte() < 250) {
        size_t j = size_t(in.range(0, int64_t(pool.size()) - 1));
        sl = pool[j];
        pool.erase(pool.begin() + int64_t(j));
      } else sl = in.range(0, std::max<int64_t>(slots - 1, 0));
      si.set(i, double(sl));
    }
    o.state_indices = si;
  } else {
    if (in.byte() < 128)
      o.initial_state = ar.values(in, "initial_state", in.pick({DType::f32, DType::bf16, DType::f16}),
                                  {N + (in.byte() < 4 ? 1 : 0), s.HV, s.DK, s.DV}, 0, 0.25);
    o.output_final_state = in.flag();
    o.final_state_dtype = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
  }
  if (in.byte() < 100) {
    fz::Buf& na = ar.add("num_accepted_tokens", DType::i32, {N});
    for (int64_t n = 0; n < N; ++n) {
      const int64_t L = s.varlen ? s.cu[size_t(n) + 1] - s.cu[size_t(n)] : s.T;
      na.set(n, double(in.byte() < 250 ? in.range(per_token ? 1 : 0, std::max<int64_t>(L, 1)) : L + 1));
    }
    o.num_accepted_tokens = na;
  }
  ar.seal();
  RecurrentOptions oref = o;
  if (cache) oref.state_cache = *cache_ref;
  const double rt = t == DType::f32 ? 1e-4 : 3e-2;
  const bool ok = fz::run_both(
      "recurrent_gated_delta_rule", [&] { return recurrent_gated_delta_rule(q, k, v, g, beta, o); },
      [&] {
        cpu::ScopedForceRef force(true);
        return recurrent_gated_delta_rule(q, k, v, g, beta, oref);
      },
      [&](auto& a, auto& b) {
        fz::expect_near("o", a.o, b.o, rt, rt);
        fz::expect_near("final_state", a.final_state, b.final_state, rt, rt);
      });
  if (cache) {
    if (ok) {
      const double rc = cache_fast->view().dtype == DType::f32 && t == DType::f32 ? 1e-4 : 3e-2;
      fz::expect_close("state_cache", cache_fast->view(), cache_ref->view(), rc, rc * fz::max_abs(cache_ref->view()) + 1e-6);
      ar.check({cache_fast, cache_ref});
    } else {
      ar.check();  // an error leaves the cache as it was
    }
  } else {
    ar.check();
  }
}
