// chunk_gated_delta_rule_fwd (spec 5.8): the whole chunked forward fused per (sequence, key head).
// Each task walks its sequence chunk by chunk with every intermediate of the chunk in per-thread
// fp32 scratch (L2-resident), so no stage tensor is materialised except what the backward needs.
#include <cmath>
#include <cstring>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "ot/workspace.h"
#include "src/gdn/chunk_fused_bf16.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"
#include "src/gemm/internal.h"

namespace ot::gdn {
using namespace detail;

namespace {

struct Args : Qkv {
  Tok g, beta;
  float scale = 1.f;
};

Args check(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta, const Layout l,
           std::optional<float> scale, const char* op) {
  Args a;
  static_cast<Qkv&>(a) = read_qkv(q, k, v, l, op);
  a.g = opt_scal(g, l, a.B, a.T, a.HV, op, "g");
  a.beta = opt_scal(beta, l, a.B, a.T, a.HV, op, "beta");
  a.scale = scale_or_default(scale, a.DK);
  return a;
}

void check_values(const Args& a, const char* op) {
  expect_finite(a.q, op, "q");
  expect_finite(a.k, op, "k");
  expect_finite(a.v, op, "v");
  if (a.g.defined()) expect_finite(a.g, op, "g");
  if (a.beta.defined()) expect_finite(a.beta, op, "beta");
}

// The fp64 path: token recurrence for o and the final state, stage references for G and A.
ChunkFwd forward_ref(const Args& a, const ChunkOptions& opt, const SeqInfo& s, DType o_dtype, bool save) {
  const char* op = "chunk_gated_delta_rule_fwd";
  ChunkFwd r;
  r.o = new_vec(opt.layout, a.v.packed, o_dtype, a.B, a.T, a.HV, a.DV);
  if (opt.output_final_state) r.final_state = Tensor::empty(DType::f32, {s.num_seqs(), a.HV, a.DK, a.DV});
  const Layout l = opt.layout;
  const std::vector<int64_t> cu = cu_of(s);
  refimpl::recurrence(vec_view(a.q, l), vec_view(a.k, l), vec_view(a.v, l), scal_view(a.g, l), scal_view(a.beta, l), opt.initial_state,
                      opt.use_qk_l2norm_in_kernel, a.scale, r.o, r.final_state, l, cu);
  if (!save) return r;
  r.g_cumsum = new_scal(opt.layout, a.v.packed, DType::f32, a.B, a.T, a.HV);
  if (a.g.defined()) refimpl::cumsum(scal_view(a.g, l), r.g_cumsum, l, cu, false, 1.f);
  else std::memset(r.g_cumsum.ptr<float>(), 0, r.g_cumsum.view().nbytes());
  Tensor ones;
  Tok bt = a.beta;
  if (!bt.defined()) {
    ones = new_scal(opt.layout, a.v.packed, DType::f32, a.B, a.T, a.HV);
    for (int64_t i = 0; i < ones.numel(); ++i) ones.ptr<float>()[i] = 1.f;
    bt = tok_scal(ones, opt.layout, op, "beta");
  }
  Tok kt = a.k;
  Tensor kn;
  if (opt.use_qk_l2norm_in_kernel) {
    // Normalised copies (same layout, contiguous) and their rstd.
    auto norm = [&](const Tok& x, Tensor& rstd) {
      Tensor y = new_vec(opt.layout, x.packed, DType::f32, x.B, x.T, x.H, x.D);
      rstd = new_scal(opt.layout, x.packed, DType::f32, x.B, x.T, x.H);
      Tok yt = tok_vec(y, opt.layout, op, "y"), rt = tok_scal(rstd, opt.layout, op, "rstd");
      for (int64_t b = 0; b < x.B; ++b)
        for (int64_t t = 0; t < x.T; ++t)
          for (int64_t h = 0; h < x.H; ++h) {
            double ss = 0;
            for (int64_t d = 0; d < x.D; ++d) ss += x.get(b, t, h, d) * x.get(b, t, h, d);
            double inv = 1.0 / std::sqrt(ss + 1e-6);
            for (int64_t d = 0; d < x.D; ++d) yt.set(b, t, h, d, x.get(b, t, h, d) * inv);
            rt.set(b, t, h, 0, inv);
          }
      return y;
    };
    norm(a.q, r.q_rstd);
    kn = norm(a.k, r.k_rstd);
    kt = tok_vec(kn, opt.layout, op, "k");
  }
  Tensor M = new_vec(opt.layout, a.v.packed, DType::f32, a.B, a.T, a.HV, kChunk, true);
  r.A = new_vec(opt.layout, a.v.packed, DType::f32, a.B, a.T, a.HV, kChunk, true);
  refimpl::kkt(vec_view(kt, l), r.g_cumsum, scal_view(bt, l), M, l, cu);
  refimpl::solve_tril(M, r.A, l, cu);
  if (opt.save_states) {
    Tensor w = new_vec(l, a.v.packed, DType::f32, a.B, a.T, a.HV, a.DK), u = new_vec(l, a.v.packed, DType::f32, a.B, a.T, a.HV, a.DV);
    refimpl::wu(vec_view(kt, l), vec_view(a.v, l), scal_view(bt, l), r.A, r.g_cumsum, w, u, l, cu);
    r.h = new_chunk_states(s, a.HV, a.DK, a.DV);
    r.v_new = new_vec(l, a.v.packed, DType::f32, a.B, a.T, a.HV, a.DV);
    refimpl::fwd_h(vec_view(kt, l), w, u, r.g_cumsum, opt.initial_state, r.h.ptr<float>(), r.v_new, TensorView{}, l, cu);
  }
  return r;
}

}  // namespace

bool detail::bf16_fused_ok(const Tok& q, const Tok& k, const Tok& v) {
  auto ok = [](const Tok& x) { return x.dt == DType::bf16 && x.sd == 1 && x.D % 32 == 0; };
  return cpu::has(cpu::Isa::avx512_bf16) && ok(q) && ok(k) && ok(v);
}

namespace {

// The forward with an fp32 final state (opt_in.initial_state in any accepted dtype).
ChunkFwd forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                 const ChunkOptions& opt_in) {
  const char* op = "chunk_gated_delta_rule_fwd";
  trace::OpScope scope(op);
  Args a = check(q, k, v, g, beta, opt_in.layout, opt_in.scale, op);
  OT_CHECK(g.defined(), op, "g", "a gate tensor", "undefined");
  OT_CHECK(beta.defined(), op, "beta", "a beta tensor", "undefined");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(opt_in, a.B, a.T, st, op);
  int64_t N = s.num_seqs(), HV = a.HV, DK = a.DK, DV = a.DV, group = HV / a.HK;
  if (opt_in.initial_state.defined()) expect_state_input(opt_in.initial_state, N, HV, DK, DV, op, "initial_state");
  check_values(a, op);
  // The state recurrence runs in fp32 whatever the initial state's dtype.
  ChunkOptions opt = opt_in;
  Tensor s0_f32;
  opt.initial_state = state_f32(opt_in.initial_state, s0_f32);
  double flops = double(a.B * a.T * HV) * (6.0 * kChunk * DK + 4.0 * kChunk * DV + 6.0 * DK * DV + kChunk * kChunk / 3.0);
  bool save = opt.save_for_backward;
  bool bf16 = !cpu::force_ref() && opt.bf16_compute && bf16_fused_ok(a.q, a.k, a.v);
  // The fused products widen bf16 to fp32 FMAs where the GEMM does (vdpbf16ps at half their flop rate).
  const bool widen = bf16 && !gemm::detail::bf16_dot_preferred();
  if (scope.active())
    scope.args(shape_args(q, v, opt.layout))
        .kernel(cpu::force_ref() ? "ref"
                : bf16           ? (widen ? "gdn_chunk:avx512_bf16_widen" : "gdn_chunk:avx512_bf16")
                                 : gemm::kernel_name(DType::f32, DType::f32, kChunk));
  scope.flops(flops);
  if (cpu::force_ref()) return forward_ref(a, opt, s, q.dtype, save);

  ChunkFwd r;
  r.o = new_vec(opt.layout, a.v.packed, q.dtype, a.B, a.T, HV, DV);
  if (opt.output_final_state) r.final_state = pooled_empty(DType::f32, {N, HV, DK, DV});
  if (save) {
    r.g_cumsum = new_scal(opt.layout, a.v.packed, DType::f32, a.B, a.T, HV);
    r.A = new_vec(opt.layout, a.v.packed, DType::f32, a.B, a.T, HV, kChunk);  // every row written
    if (opt.use_qk_l2norm_in_kernel) {
      r.q_rstd = new_scal(opt.layout, a.q.packed, DType::f32, a.B, a.T, a.HK);
      r.k_rstd = new_scal(opt.layout, a.q.packed, DType::f32, a.B, a.T, a.HK);
    }
    if (opt.save_states) {
      r.h = new_chunk_states(s, HV, DK, DV);
      r.v_new = new_vec(opt.layout, a.v.packed, DType::f32, a.B, a.T, HV, DV);
    }
  }
  Tok ot = tok_vec(r.o, opt.layout, op, "o");
  float* hs = r.h.defined() ? r.h.ptr<float>() : nullptr;  // the state before every chunk (save_states)
  Tok vnt = r.v_new.defined() ? tok_vec(r.v_new, opt.layout, op, "v_new") : Tok{};
  Tok Gt, At, rq, rk;
  if (save) {
    Gt = tok_scal(r.g_cumsum, opt.layout, op, "g_cumsum");
    At = tok_vec(r.A, opt.layout, op, "A");
    if (r.q_rstd.defined()) rq = tok_scal(r.q_rstd, opt.layout, op, "q_rstd"), rk = tok_scal(r.k_rstd, opt.layout, op, "k_rstd");
  }
  StateRef S0 = state_ref(opt.initial_state), fin = state_ref(r.final_state);
  bool l2 = opt.use_qk_l2norm_in_kernel;
  if (bf16) {
    Bf16Fwd f;
    f.q = a.q, f.k = a.k, f.v = a.v, f.g = a.g, f.beta = a.beta;
    f.o = ot, f.G = Gt, f.A = At, f.rq = rq, f.rk = rk, f.S0 = S0, f.fin = fin, f.s = &s, f.h = hs, f.v_new = vnt;
    f.scale = a.scale, f.l2 = l2, f.widen = widen, f.HK = a.HK, f.HV = HV, f.DK = DK, f.DV = DV;
    parallel_for_dynamic(N * a.HK, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) bf16_fused_task(f, i / a.HK, i % a.HK);
    });
    return r;
  }
  // One task per (sequence, key head): K, Q, their norms and [K; Q] K^T are computed once per
  // chunk and shared by the `group` value heads, each with its own state.
  const int64_t C = kChunk, SD = (DK + C) * DV;
  WorkspacePlan plan;
  Slot<float> slot = plan.add<float>(size_t(2 * C * DK + C * DV + 8 * C + 5 * C * C + 2 * C * (DK + DV) + C * (DK + C) + C * DV +
                                            C * DK + group * SD),
                                     true);
  Workspace ws(plan);
  parallel_for_dynamic(N * a.HK, 1, [&](int64_t i0, int64_t i1) {
    float* p = ws.get(slot, thread_id());
    FusedBufs b;
    auto take = [&](int64_t n) { float* r = p; p += n; return r; };
    b.kq = take(2 * C * DK), b.v = take(C * DV), b.g = take(C), b.G = take(C), b.beta = take(C), b.rq = take(C), b.rk = take(C);
    b.E = take(C * C), b.M = take(C * C), b.A = take(C * C), b.kkq = take(2 * C * C), b.kbvb = take(C * (DK + DV));
    b.wu = take(C * (DK + DV)), b.qsp = take(C * (DK + C)), b.o = take(C * DV), b.kd = take(C * DK);
    float* states = take(group * SD);
    for (int64_t i = i0; i < i1; ++i) {
      int64_t n = i / a.HK, hk = i % a.HK;
      for (int64_t j = 0; j < group; ++j) {
        if (S0.defined()) std::memcpy(states + j * SD, S0.f32(n, hk * group + j), sizeof(float) * size_t(DK * DV));
        else std::memset(states + j * SD, 0, sizeof(float) * size_t(DK * DV));
      }
      int64_t nc = s.chunk_offsets[size_t(n + 1)] - s.chunk_offsets[size_t(n)];
      for (int64_t c = 0; c < nc; ++c) {
        ChunkSpan sp = chunk_span(s, n, c);
        int64_t L = sp.L;
        load_rows(a.k, sp.b, sp.t0, L, hk, b.kq, DK);
        load_rows(a.q, sp.b, sp.t0, L, hk, b.kq + C * DK, DK);
        if (l2) {
          l2norm_rows(b.kq, DK, L, DK, 1e-6f, b.rk);
          l2norm_rows(b.kq + C * DK, DK, L, DK, 1e-6f, b.rq);
          if (rq.defined()) {
            store_scal(b.rq, rq, sp.b, sp.t0, L, hk);
            store_scal(b.rk, rk, sp.b, sp.t0, L, hk);
          }
        }
        fused_chunk_kkq(b, L, DK);
        for (int64_t j = 0; j < group; ++j) {
          int64_t hv = hk * group + j;
          b.sd = states + j * SD;
          load_rows(a.v, sp.b, sp.t0, L, hv, b.v, DV);
          load_scal(a.g, sp.b, sp.t0, L, hv, b.g);
          load_scal(a.beta, sp.b, sp.t0, L, hv, b.beta);
          if (hs) std::memcpy(hs + (s.chunk_id(n, c) * HV + hv) * DK * DV, b.sd, sizeof(float) * size_t(DK * DV));
          fused_chunk_fwd(b, L, DK, DV, a.scale);
          store_rows(b.o, DV, ot, sp.b, sp.t0, L, hv);
          if (hs) store_rows(b.sd + DK * DV, DV, vnt, sp.b, sp.t0, L, hv);  // v_new, stacked under S
          if (save) {
            store_scal(b.G, Gt, sp.b, sp.t0, L, hv);
            store_rows(b.A, C, At, sp.b, sp.t0, L, hv);
          }
        }
      }
      for (int64_t j = 0; j < group; ++j)
        if (fin.defined()) std::memcpy(fin.f32(n, hk * group + j), states + j * SD, sizeof(float) * size_t(DK * DV));
    }
  });
  return r;
}

}  // namespace

ChunkFwd chunk_gated_delta_rule_fwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                    const TensorView& beta, const ChunkOptions& opt) {
  const char* op = "chunk_gated_delta_rule_fwd";
  state_as(Tensor(), opt.final_state_dtype, op, "final_state_dtype");  // rejected before any work
  ChunkFwd r = forward(q, k, v, g, beta, opt);
  r.final_state = state_as(std::move(r.final_state), opt.final_state_dtype, op, "final_state_dtype");
  return r;
}

namespace ref {
ChunkFwd recurrence(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                    const ChunkOptions& opt) {
  const char* op = "gdn_recurrence_ref";
  Args a = check(q, k, v, g, beta, opt.layout, opt.scale, op);
  SeqInfo st;
  const SeqInfo& s = resolve_seq(opt, a.B, a.T, st, op);
  if (opt.initial_state.defined()) expect_state_input(opt.initial_state, s.num_seqs(), a.HV, a.DK, a.DV, op, "initial_state");
  ChunkOptions o = opt;
  Tensor s0_f32;
  o.initial_state = state_f32(opt.initial_state, s0_f32);
  return forward_ref(a, o, s, DType::f32, false);
}
}  // namespace ref

}  // namespace ot::gdn
