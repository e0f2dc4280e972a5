// moe_token_permute / moe_token_unpermute (plain [T, K] / [T] ids with num_out_tokens, and the
// padded [E, C] capacity layout), moe_compute_expert_tokens and moe_re_routing.
#include "fuzz/fuzz_util.h"
#include "ot/moe.h"

using namespace ot;
using namespace ot::moe;

namespace {

// Mostly in [lo, hi], rarely just outside.
int64_t id(fz::Input& in, int64_t lo, int64_t hi) { return in.byte() < 250 ? in.range(lo, hi) : in.pick<int64_t>({lo - 1, hi + 1}); }

void permute(fz::Input& in, fz::Arena& ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::i8, DType::i32});
  const int64_t T = in.range(0, 8), H = in.range(0, 12), K = in.range(1, 4), E = in.range(1, 8);
  const bool padded = in.byte() < 64;
  fz::Buf& tok = ar.add("tokens", t, {T, H}, in.byte() < 40 ? in.range(1, 3) : 0);
  for (int64_t i = 0; i < tok.numel(); ++i) tok.set(i, is_float(t) ? in.grid() : double(int(in.byte()) - 128));
  std::vector<int64_t> ishape = padded ? std::vector<int64_t>{E, in.range(0, 4)} : in.byte() < 40 ? std::vector<int64_t>{T} : std::vector<int64_t>{T, K};
  fz::Buf& idx = ar.add("indices", in.byte() < 252 ? DType::i32 : DType::i64, ishape);
  for (int64_t i = 0; i < idx.numel(); ++i) idx.set(i, double(padded ? id(in, 0, T - 1) : id(in, 0, E)));
  const int64_t nout = in.pick<int64_t>({0, 0, in.range(1, T * K + 2), -in.range(1, T * K + 2)});
  ar.seal();
  fz::run_both(
      "moe_token_permute", [&] { return moe_token_permute(tok, idx, nout, padded); },
      [&] { return ref::moe_token_permute(tok, idx, nout, padded); },
      [&](auto& a, auto& b) {
        fz::expect_close("permuted_tokens", a.permuted_tokens, b.permuted_tokens);
        fz::expect_close("sorted_indices", a.sorted_indices, b.sorted_indices);
      });
}

void unpermute(fz::Input& in, fz::Arena& ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::i8});
  const int64_t T = in.range(0, 8), H = in.range(0, 12), K = in.range(1, 4), P = in.range(0, 12);
  const bool padded = in.byte() < 64;
  fz::Buf& pt = ar.add("permuted_tokens", t, {P, H}, in.byte() < 40 ? in.range(1, 3) : 0);
  for (int64_t i = 0; i < pt.numel(); ++i) pt.set(i, is_float(t) ? in.grid() : 1.0);
  // Plain: [T*K] destinations (any value: out-of-range rows are skipped); padded: [P] token ids.
  const int64_t n_idx = padded ? P : (in.byte() < 250 ? T * K : T * K + 1);
  fz::Buf& si = ar.add("sorted_indices", DType::i32, {n_idx});
  for (int64_t i = 0; i < n_idx; ++i) si.set(i, double(padded ? id(in, 0, T - 1) : in.range(-2, P + 1)));
  TensorView probs;
  if (in.byte() < 200) {
    const DType pt_t = in.pick({DType::f32, DType::bf16, DType::f32});
    std::vector<int64_t> ps = padded ? std::vector<int64_t>{P, 1} : std::vector<int64_t>{T, K};
    fz::Buf& pr = ar.add("probs", pt_t, ps);
    for (int64_t i = 0; i < pr.numel(); ++i) pr.set(i, in.byte() < 40 ? 0.0 : in.grid(8, 0, 1));
    probs = pr;
  }
  const int64_t restore = padded ? in.arg(0, T) : in.pick<int64_t>({-1, T, T + 1});
  ar.seal();
  // fp32 sums of up to K (plain) or P (padded) products of size <= 4.
  const double atol = fz::rtol_of(t == DType::i8 ? DType::f32 : t) * 4.0 * double(std::max(K, P));
  fz::run_both(
      "moe_token_unpermute", [&] { return moe_token_unpermute(pt, si, probs, padded, restore); },
      [&] { return ref::moe_token_unpermute(pt, si, probs, padded, restore); },
      [&](auto& a, auto& b) { fz::expect_close("out", a, b, fz::rtol_of(a.dtype()), atol); });
}

void expert_tokens(fz::Input& in, fz::Arena& ar) {
  const int64_t L = in.range(0, 16), E = in.arg(1, 12);
  fz::Buf& s = ar.add("sorted_experts", in.byte() < 250 ? DType::i32 : DType::i64, {L});
  int64_t v = 0;
  for (int64_t i = 0; i < L; ++i) {
    v += in.range(0, 2);
    s.set(i, double(in.byte() < 250 ? std::min<int64_t>(v, std::max<int64_t>(0, std::min<int64_t>(E, 64) - 1)) : in.range(-1, 13)));
  }
  ar.seal();
  fz::run_both(
      "moe_compute_expert_tokens", [&] { return moe_compute_expert_tokens(s, E); }, [&] { return ref::moe_compute_expert_tokens(s, E); },
      [&](auto& a, auto& b) { fz::expect_close("expert_tokens", a, b); });
}

void re_routing(fz::Input& in, fz::Arena& ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::i8, DType::f16});
  const int64_t R = in.range(0, 4), El = in.range(0, 4), H = in.range(0, 8);
  fz::Buf& c = ar.add("expert_token_num_per_rank", in.pick({DType::i32, DType::i64}), {R, El});
  int64_t A = 0;
  for (int64_t i = 0; i < c.numel(); ++i) {
    int64_t n = in.byte() < 250 ? in.range(0, 3) : -1;
    c.set(i, double(n));
    A += n;
  }
  if (in.byte() < 6) A += in.pick<int64_t>({1, -1});
  A = std::max<int64_t>(A, 0);
  fz::Buf& tok = ar.add("tokens", t, {A, H}, in.byte() < 40 ? 1 : 0);
  for (int64_t i = 0; i < tok.numel(); ++i) tok.set(i, is_float(t) ? in.grid() : double(int(in.byte()) - 128));
  TensorView scales;
  if (in.flag()) {
    fz::Buf& s = ar.values(in, "per_token_scales", in.byte() < 250 ? DType::f32 : DType::bf16, {in.byte() < 250 ? A : A + 1});
    scales = s;
  }
  ar.seal();
  fz::run_both(
      "moe_re_routing", [&] { return moe_re_routing(tok, c, scales); }, [&] { return ref::moe_re_routing(tok, c, scales); },
      [&](auto& a, auto& b) {
        fz::expect_close("permute_tokens", a.permute_tokens, b.permute_tokens);
        fz::expect_close("permute_per_token_scales", a.permute_per_token_scales, b.permute_per_token_scales);
        fz::expect_close("permute_token_idx", a.permute_token_idx, b.permute_token_idx);
        fz::expect_close("expert_token_num", a.expert_token_num, b.expert_token_num);
      });
}

}  // namespace

OT_FUZZ_TARGET(in, ar) {
  switch (in.range(0, 3)) {
    case 0: permute(in, ar); break;
    case 1: unpermute(in, ar); break;
    case 2: expert_tokens(in, ar); break;
    default: re_routing(in, ar); break;
  }
  ar.check();
}
