// chunk_gated_delta_rule_fwd and chunk_gated_delta_rule_bwd (fixed-length batches and cu_seqlens,
// BTHD / BHTD, packed varlen views, strided inputs, grouped value heads, initial / final states in
// every dtype, in-kernel l2norm, dht, saved or recomputed A, the forward's saved states h / v_new,
// the opt-in bf16 products) against the fp64 token recurrence
// (the OT_FORCE_REF path: same validation, nothing else shared).
#include "fuzz/gdn_inputs.h"
#include "ot/cpu.h"
#include "ot/gdn_bwd.h"

using namespace ot;
using namespace ot::gdn;

// |x| elementwise in x's dtype, dense (undefined stays undefined).
static Tensor abs_of(const TensorView& x) {
  if (!x.defined()) return Tensor();
  Tensor r = Tensor::empty(x.dtype, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) set_from_double(r.view(), i, std::fabs(get_as_double(x, i)));
  return r;
}

OT_FUZZ_TARGET(in, ar) {
  const bool bwd = in.byte() < 100;
  const fz::GdnShape s = fz::gdn_shape(in, 20);
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
  const double ks = 1.0 / std::sqrt(double(std::max<int64_t>(s.DK, 1)));
  fz::Buf& q = fz::gdn_vec(in, ar, "q", t, s.vec(s.HK, s.DK), ks);
  fz::Buf& k = fz::gdn_vec(in, ar, "k", in.byte() < 252 ? t : DType::i32, s.vec(s.HK, s.DK), ks);
  fz::Buf& v = fz::gdn_vec(in, ar, "v", t, s.vec(s.HV, s.DV), 0.25);
  const DType st = in.pick({DType::f32, DType::bf16, DType::f32});
  fz::Buf& g = fz::gdn_scal(in, ar, "g", st, s.scal(s.HV), -1, 0);
  fz::Buf& beta = fz::gdn_scal(in, ar, "beta", st, s.scal(s.HV), 0, 1);
  Common c;
  c.layout = s.layout;
  if (s.varlen) c.cu_seqlens = fz::cu_seqlens(in, ar, s);
  const bool l2 = in.flag();
  const std::optional<float> scale = in.flag() ? std::optional<float>(in.pick({0.5f, 1.f, 0.125f})) : std::nullopt;
  TensorView h0;
  if (in.byte() < 100) h0 = ar.values(in, "initial_state", in.pick({DType::f32, DType::bf16, DType::f16}),
                                      {std::max<int64_t>(s.seqs(), 0) + (in.byte() < 4 ? 1 : 0), s.HV, s.DK, s.DV}, 0, 0.25);
  const double rt = t == DType::f32 ? 1e-4 : 3e-2;
  if (!bwd) {
    ChunkOptions o;
    static_cast<Common&>(o) = c;
    o.scale = scale;
    o.initial_state = h0;
    o.output_final_state = in.flag();
    o.final_state_dtype = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
    o.use_qk_l2norm_in_kernel = l2;
    o.save_for_backward = in.flag();
    o.bf16_compute = in.flag();
    ar.seal();
    fz::run_vs_forced_ref(
        "chunk_gated_delta_rule_fwd", [&] { return chunk_gated_delta_rule_fwd(q, k, v, g, beta, o); },
        [&](auto& a, auto& b) {
          fz::expect_near("o", a.o, b.o, rt, rt);
          fz::expect_near("final_state", a.final_state, b.final_state, rt, rt);
          fz::expect_near("g_cumsum", a.g_cumsum, b.g_cumsum, 1e-5, 1e-6);
          fz::expect_near("A", a.A, b.A, rt, rt);
          fz::expect_near("q_rstd", a.q_rstd, b.q_rstd, 1e-4, 1e-5);
          fz::expect_near("k_rstd", a.k_rstd, b.k_rstd, 1e-4, 1e-5);
        });
    ar.check();
    return;
  }
  // Backward: the chunk-local cumulative gate comes from the stage operator (what a training
  // step saves); the reference path recovers the raw gate from it and differentiates the
  // token recurrence exactly.
  fz::Buf& dO = fz::gdn_vec(in, ar, "dO", t, s.vec(s.HV, s.DV), 0.25);
  ChunkBwdOptions o;
  static_cast<Common&>(o) = c;
  o.scale = scale;
  o.initial_state = h0;
  o.use_qk_l2norm_in_kernel = l2;
  if (in.byte() < 80) o.dht = ar.values(in, "dht", DType::f32, {std::max<int64_t>(s.seqs(), 0), s.HV, s.DK, s.DV}, 0, 0.25);
  const bool saved_A = in.flag(), saved_states = in.flag();
  o.bf16_compute = in.flag();
  ar.seal();
  Tensor G;
  ChunkFwd f;
  try {
    G = chunk_local_cumsum(g, false, 1.f, c);
    if (saved_A || saved_states) {
      ChunkOptions fo;
      static_cast<Common&>(fo) = c;
      fo.use_qk_l2norm_in_kernel = l2;
      fo.initial_state = h0;  // the states start from it
      fo.save_states = saved_states;
      f = chunk_gated_delta_rule_fwd(q, k, v, g, beta, fo);
    }
  } catch (const Error&) {
    ar.check();
    return;  // bad inputs: the forward named them (its own target checks that)
  }
  // The largest gradient of the reference backward over the inputs' absolute values.
  auto term_magnitude = [&](const ChunkBwdOptions& with) {
    Tensor aq = abs_of(q), ak = abs_of(k), av = abs_of(v), adO = abs_of(dO), ah0 = abs_of(with.initial_state), adht = abs_of(with.dht);
    ChunkBwdOptions m = with;
    m.initial_state = ah0.view();
    m.dht = adht.view();
    m.A = m.h = m.v_new = TensorView();  // saved from the signed inputs: recomputed instead
    ot::cpu::ScopedForceRef force(true);
    const ChunkBwd r = chunk_gated_delta_rule_bwd(aq, ak, av, G, beta, adO, m);
    double mag = 0;
    for (const Tensor* x : {&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.dh0})
      if (x->defined()) mag = std::max(mag, fz::max_abs(x->view()));
    return mag;
  };
  if (saved_A) o.A = f.A;
  if (saved_states) o.h = f.h, o.v_new = f.v_new;
  fz::run_vs_forced_ref(
      "chunk_gated_delta_rule_bwd", [&] { return chunk_gated_delta_rule_bwd(q, k, v, G, beta, dO, o); },
      [&](auto& a, auto& b) {
        // dg and dbeta are sums of products of the other gradients with q, k, v (dg_t cancels to
        // ~1e-6 where dbeta is ~100): each gradient is held to a fraction of the largest one.
        // The opt-in bf16 products round every product's operands to bf16: where a gradient's
        // terms cancel, that error grows with the cancellation (seen: 14% of one dq element at
        // DK = 1), so the mode is held to a fifth of the largest gradient (crash-free and sane).
        const double rb = o.bf16_compute && t == DType::bf16 ? 0.2 : t == DType::f32 ? 1e-3 : 5e-2;
        double scale = 0;
        for (const Tensor* x : {&b.dq, &b.dk, &b.dv, &b.dg, &b.dbeta, &b.dh0})
          if (x->defined()) scale = std::max(scale, fz::max_abs(x->view()));
        // The bf16 products' error is a fraction of the terms a gradient sums, not of the sum: where
        // every gradient cancels (seen: T = 1, beta = 0, q.k = 1.6e-4 of |q||k|, so dbeta = 8e-6 is
        // the largest gradient and bf16 q, k miss it by 7e-6), the bound follows the terms' size,
        // the same backward over |q|, |k|, |v|, |dO|, |h0|, |dht| (nothing cancels there).
        if (o.bf16_compute) scale = std::max(scale, term_magnitude(o));
        // A gradient stored in a 16-bit dtype (dg / dbeta in the gates', dh0 in the initial state's)
        // is rounded to it (2^-9 relative) even when q, k, v are fp32.
        auto near = [&](const char* what, const Tensor& x, const Tensor& y) {
          FZ_ASSERT(x.defined() == y.defined(), what, ": defined ", x.defined(), " vs reference ", y.defined());
          const double r = x.defined() && x.dtype() != DType::f32 ? std::max(rb, 1e-2) : rb;
          if (x.defined()) fz::expect_close(what, x.view(), y.view(), r, r * scale + 1e-6);
        };
        // The l2norm's backward multiplies a row's gradient by 1/sqrt(|q|^2 + eps) (1000 at a zero
        // row): there the bf16 products' error, relative to their terms, grew 5x past the mode's
        // bound (a zero q row, DK = 1). In that mode dq and dk are held to it before the factor:
        // both sides' rows times sqrt(|q|^2 + eps) (|k|^2 for dk), computed once per row.
        auto row_norms = [](const fz::Buf& x, int64_t D) {
          std::vector<double> n(size_t(D > 0 ? x.numel() / D : 0), 1e-6);
          for (int64_t i = 0; i < int64_t(n.size()) * D; ++i) n[size_t(i / D)] += x.get(i) * x.get(i);
          for (double& v : n) v = std::sqrt(v);
          return n;
        };
        auto before_norm = [](const Tensor& gr, const std::vector<double>& norm, int64_t D) {
          Tensor r = Tensor::empty(gr.dtype(), gr.view().shape());
          for (int64_t i = 0; i < int64_t(norm.size()) * D; ++i)
            set_from_double(r.view(), i, get_as_double(gr.view(), i) * norm[size_t(i / D)]);
          return r;
        };
        if (o.bf16_compute && l2 && s.DK > 0 && a.dq.defined() && b.dq.defined() && a.dk.defined() && b.dk.defined()) {
          const std::vector<double> nq = row_norms(q, s.DK), nk = row_norms(k, s.DK);
          near("dq", before_norm(a.dq, nq, s.DK), before_norm(b.dq, nq, s.DK));
          near("dk", before_norm(a.dk, nk, s.DK), before_norm(b.dk, nk, s.DK));
        } else {
          near("dq", a.dq, b.dq);
          near("dk", a.dk, b.dk);
        }
        near("dv", a.dv, b.dv);
        near("dg", a.dg, b.dg);
        near("dbeta", a.dbeta, b.dbeta);
        near("dh0", a.dh0, b.dh0);
      });
  ar.check();
}
