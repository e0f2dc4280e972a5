// recurrent_gated_delta_rule (spec 3.1): decode and speculative verification, one task per
// (sequence, value head), the state streamed from and to its slot (or in/out tensors).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "ot/cpu.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/kernel_list.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/gdn_internal.h"

namespace ot::gdn {
namespace detail {
namespace generic {
void step(const void*, bool, void*, bool, const float*, const float*, const float*, float, float, float, int64_t, int64_t, float*, float*);
}
namespace avx512 {
void step(const void*, bool, void*, bool, const float*, const float*, const float*, float, float, float, int64_t, int64_t, float*, float*);
}
namespace avx2 {
void step(const void*, bool, void*, bool, const float*, const float*, const float*, float, float, float, int64_t, int64_t, float*, float*);
}
}  // namespace detail
using namespace detail;

namespace {

using StepFn = void (*)(const void*, bool, void*, bool, const float*, const float*, const float*, float, float, float, int64_t, int64_t,
                        float*, float*);

const cpu::KernelEntry<StepFn, cpu::AnyPlan> kStepKernels[] = {
    {cpu::Isa::avx512, nullptr, &avx512::step, "avx512"},
    {cpu::Isa::avx2, nullptr, &avx2::step, "avx2"},
    {cpu::Isa::scalar, nullptr, &generic::step, "generic"},
};

// fp64 step for the reference path: same contract with a double scratch state.
void step_ref(const double* s_in, double* s_out, const float* q, const float* k, const float* v, double a, double beta, double scale,
              int64_t DK, int64_t DV, float* o) {
  std::vector<double> d(size_t(DV), 0.0), acc(size_t(DV), 0.0);
  for (int64_t r = 0; r < DK; ++r)
    for (int64_t e = 0; e < DV; ++e) d[size_t(e)] += (s_in ? s_in[r * DV + e] : 0.0) * k[r];
  for (int64_t e = 0; e < DV; ++e) d[size_t(e)] = beta * (v[e] - a * d[size_t(e)]);
  for (int64_t r = 0; r < DK; ++r)
    for (int64_t e = 0; e < DV; ++e) {
      double x = a * (s_in ? s_in[r * DV + e] : 0.0) + k[r] * d[size_t(e)];
      s_out[r * DV + e] = x;
      acc[size_t(e)] += q[r] * x;
    }
  for (int64_t e = 0; e < DV; ++e) o[e] = float(scale * acc[size_t(e)]);
}

void copy_state(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (!src) {
    std::memset(dst, 0, size_t(n) * dtype_size(dt));
    return;
  }
  if (st == dt) return (void)std::memcpy(dst, src, size_t(n) * dtype_size(dt));
  if (st == DType::f32) return convert_from_f32(static_cast<const float*>(src), dst, dt, n);
  convert_to_f32(src, st, static_cast<float*>(dst), n);
}

float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace

RecurrentOut recurrent_gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                        const TensorView& beta, const RecurrentOptions& opt) {
  const char* op = "recurrent_gated_delta_rule";
  trace::OpScope scope(op);
  Layout l = opt.layout;
  const Qkv a = read_qkv(q, k, v, l, op);
  const Tok &qt = a.q, &kt = a.k, &vt = a.v;
  const int64_t B = a.B, T = a.T, HK = a.HK, HV = a.HV, DK = a.DK, DV = a.DV;
  Tok gt = opt_scal(g, l, B, T, HV, op, "g"), bt = opt_scal(beta, l, B, T, HV, op, "beta");
  bool fused_gate = opt.A_log.defined() || opt.dt_bias.defined();
  if (fused_gate) {
    for (auto [x, name] : {std::pair{&opt.A_log, "A_log"}, {&opt.dt_bias, "dt_bias"}})
      OT_CHECK(x->defined() && x->dtype == DType::f32 && x->numel() == HV && x->is_contiguous(), op, name,
               ::ot::detail::cat("contiguous fp32 [", HV, "] (A_log and dt_bias together)"), x->defined() ? x->shape_str() : "undefined");
    OT_CHECK(g.defined(), op, "g", "the raw gate input `a` when A_log/dt_bias are given", "undefined");
  }
  OT_CHECK(!opt.beta_sigmoid || beta.defined(), op, "beta", "the raw `b` when beta_sigmoid", "undefined");
  state_as(Tensor(), opt.final_state_dtype, op, "final_state_dtype");
  SeqInfo sst;
  const SeqInfo& s = resolve_seq(opt, B, T, sst, op);
  int64_t N = s.num_seqs();
  float scale = scale_or_default(opt.scale, DK);

  // Accepted-token counts and slots.
  bool cache = opt.state_cache.defined();
  std::vector<int64_t> accepted(static_cast<size_t>(N));
  bool per_token = false;
  const int32_t* idx = nullptr;
  int64_t slots = 0;
  StateRef C;
  if (cache) {
    OT_CHECK(!opt.initial_state.defined(), op, "initial_state", "undefined when state_cache is given", opt.initial_state.shape_str());
    slots = opt.state_cache.ndim == 4 ? opt.state_cache.sizes[0] : 0;
    expect_state(opt.state_cache, slots, HV, DK, DV, true, op, "state_cache");
    C = state_ref(opt.state_cache);
    const TensorView& si = opt.state_indices;
    OT_CHECK(si.defined() && si.dtype == DType::i32 && si.ndim == 1 && si.is_contiguous() && (si.sizes[0] == N || si.sizes[0] == B * T), op,
             "state_indices", ::ot::detail::cat("contiguous int32 [", N, "] (per sequence) or [", B * T, "] (per token)"),
             si.defined() ? si.shape_str() : "undefined");
    idx = si.ptr<int32_t>();
    per_token = si.sizes[0] != N;
  } else {
    OT_CHECK(!opt.state_indices.defined(), op, "state_indices", "undefined without state_cache", opt.state_indices.shape_str());
    if (opt.initial_state.defined()) expect_state_input(opt.initial_state, N, HV, DK, DV, op, "initial_state");
  }
  const TensorView& na = opt.num_accepted_tokens;
  if (na.defined())
    OT_CHECK(na.dtype == DType::i32 && na.ndim == 1 && na.sizes[0] == N && na.is_contiguous(), op, "num_accepted_tokens",
             ::ot::detail::cat("contiguous int32 [", N, "]"), na.shape_str());
  for (int64_t n = 0; n < N; ++n) {
    int64_t L = s.len[size_t(n)], a = na.defined() ? na.ptr<int32_t>()[n] : (per_token ? 1 : L);
    if (per_token && L > 0)
      OT_CHECK(a >= 1 && a <= L, op, "num_accepted_tokens", ::ot::detail::cat("a count in [1, ", L, "] for sequence ", n), a);
    else if (!per_token)
      OT_CHECK(a >= 0 && a <= L, op, "num_accepted_tokens", ::ot::detail::cat("a count in [0, ", L, "] for sequence ", n), a);
    accepted[size_t(n)] = a;
  }
  auto flat = [&](int64_t n, int64_t t) { return s.row[size_t(n)] * T + t; };
  std::vector<int32_t> read_slot(size_t(N), -1);
  if (cache) {
    std::unordered_map<int32_t, int64_t> writer;  // slot -> sequence writing it
    auto write = [&](int32_t sl, int64_t n) {
      OT_CHECK(sl < slots, op, "state_indices", ::ot::detail::cat("slots in [0, ", slots, ")"), sl);
      if (sl < 0) return;
      auto [it, fresh] = writer.emplace(sl, n);
      OT_CHECK(fresh, op, "state_indices", "distinct slots within one call", "slot ", sl, " written twice");
    };
    for (int64_t n = 0; n < N; ++n) {
      int64_t L = s.len[size_t(n)], bos = s.bos[size_t(n)];
      if (L == 0) continue;
      int32_t rs = per_token ? idx[flat(n, bos + accepted[size_t(n)] - 1)] : idx[n];
      OT_CHECK(rs >= 0 && rs < slots, op, "state_indices", ::ot::detail::cat("slots in [0, ", slots, ")"), rs);
      read_slot[size_t(n)] = rs;
      if (per_token)
        for (int64_t t = bos; t < bos + L; ++t) write(idx[flat(n, t)], n);
      else
        write(idx[n], n);
    }
    for (int64_t n = 0; n < N; ++n) {
      auto it = read_slot[size_t(n)] >= 0 ? writer.find(read_slot[size_t(n)]) : writer.end();
      OT_CHECK(it == writer.end() || it->second == n, op, "state_indices", "no slot read by one sequence and written by another",
               "slot ", read_slot[size_t(n)]);
    }
  }
  expect_finite(qt, op, "q");
  expect_finite(kt, op, "k");
  expect_finite(vt, op, "v");
  if (gt.defined()) expect_finite(gt, op, "g");
  if (bt.defined()) expect_finite(bt, op, "beta");

  RecurrentOut r;
  r.o = new_vec(l, vt.packed, q.dtype, B, T, HV, DV);
  bool want_final = !cache && opt.output_final_state;
  if (want_final) r.final_state = Tensor::empty(DType::f32, {N, HV, DK, DV});
  Tok ot = tok_vec(r.o, l, op, "o");
  // An fp16 initial state is widened once (the kernels read fp32 and bf16 states directly).
  Tensor s0_f32;
  StateRef S0 = state_ref(opt.initial_state.defined() && opt.initial_state.dtype == DType::f16 ? state_f32(opt.initial_state, s0_f32)
                                                                                                 : opt.initial_state);
  StateRef fin = state_ref(r.final_state);
  const float* A_log = fused_gate ? opt.A_log.ptr<float>() : nullptr;
  const float* dt_bias = fused_gate ? opt.dt_bias.ptr<float>() : nullptr;
  bool ref = cpu::force_ref();
  const auto& step_kernel = cpu::select_kernel("recurrent_gated_delta_rule", kStepKernels);
  const StepFn fast = step_kernel.fn;
  double state_bytes = 0;
  for (int64_t n = 0; n < N; ++n)
    if (s.len[size_t(n)] > 0) state_bytes += 2.0 * double(HV * DK * DV) * double(cache ? dtype_size(C.dt) : 4);
  if (scope.active()) scope.args(shape_args(q, v, l)).kernel(ref ? "ref" : step_kernel.name);
  scope.bytes(state_bytes);
  int64_t group = HV / HK, SS = DK * DV;

  // Scratch per thread: state (fp32, or fp64 for the reference), q, k, v, o, tmp; kept across
  // calls (a decode step is ~0.1 ms: fresh pages per call would cost a visible part of it).
  // (A small model's step, a few states of KiBs, on the calling thread.)
  const double call_bytes = state_bytes + double(q.nbytes() + k.nbytes() + 2 * v.nbytes());
  parallel_for_dynamic_sized(N * HV, 0, call_bytes, [&](int64_t i0, int64_t i1) {
    static thread_local std::vector<double> scratch;
    if (scratch.size() < size_t(SS + 5 * 256 / 2 + 8)) scratch.assign(size_t(SS + 5 * 256 / 2 + 8), 0.0);
    double* Sd = scratch.data();
    float* Sf = reinterpret_cast<float*>(Sd);
    float *qv = reinterpret_cast<float*>(Sd + SS), *kv = qv + 256, *vv = kv + 256, *ov = vv + 256, *tmp = ov + 256;
    for (int64_t i = i0; i < i1; ++i) {
      int64_t n = i / HV, hv = i % HV, hk = hv / group, L = s.len[size_t(n)], bos = s.bos[size_t(n)], b = s.row[size_t(n)];
      int64_t commit = accepted[size_t(n)];
      // Source of the initial state and target of the committed state.
      const void* src = nullptr;
      DType src_dt = DType::f32;
      void* target = nullptr;
      DType tgt_dt = DType::f32;
      if (cache && i + 1 < i1 && !ref) {
        // The next task's first column tile (what its first sweep reads) on its way to L2
        // while this state streams: the step prefetches its own later tiles.
        int64_t n1 = (i + 1) / HV;
        if (s.len[size_t(n1)] > 0 && read_slot[size_t(n1)] >= 0) {
          const char* nx = static_cast<const char*>(C.at(read_slot[size_t(n1)], (i + 1) % HV));
          int64_t row = DV * int64_t(dtype_size(C.dt));
          for (int64_t r = 0; r < DK; ++r) __builtin_prefetch(nx + r * row, 0, 2), __builtin_prefetch(nx + r * row + 64, 0, 2);
        }
      }
      if (cache) {
        if (L == 0) continue;
        src = C.at(read_slot[size_t(n)], hv), src_dt = C.dt;
        if (!per_token) target = C.at(idx[n], hv), tgt_dt = C.dt;
      } else {
        if (S0.defined()) src = S0.at(n, hv), src_dt = S0.dt;
        if (fin.defined()) target = fin.at(n, hv);
      }
      if (!per_token && commit == 0 && target && target != src) copy_state(src, src_dt, target, tgt_dt, SS);  // nothing accepted
      for (int64_t j = 0; j < L; ++j) {
        int64_t t = bos + j;
        load_rows(qt, b, t, 1, hk, qv, DK);
        load_rows(kt, b, t, 1, hk, kv, DK);
        load_rows(vt, b, t, 1, hv, vv, DV);
        if (opt.use_qk_l2norm_in_kernel) {
          l2norm_rows(qv, DK, 1, DK, 1e-6f, nullptr);
          l2norm_rows(kv, DK, 1, DK, 1e-6f, nullptr);
        }
        float gr = gt.defined() ? gt.scalar(b, t, hv) : 0.f;
        float gate = fused_gate ? -std::exp(A_log[hv]) * softplus(gr + dt_bias[hv]) : gr;
        float br = bt.defined() ? bt.scalar(b, t, hv) : 1.f;
        float bet = opt.beta_sigmoid ? 1.f / (1.f + std::exp(-br)) : br;
        float alpha = std::exp(gate);
        int32_t snap = per_token ? idx[flat(n, t)] : -1;
        bool commit_here = !per_token && j + 1 == commit && target;
        if (ref) {
          if (j == 0) {
            std::vector<float> s0(static_cast<size_t>(SS));
            copy_state(src, src_dt, s0.data(), DType::f32, SS);
            for (int64_t e = 0; e < SS; ++e) Sd[e] = s0[size_t(e)];
          }
          step_ref(Sd, Sd, qv, kv, vv, alpha, bet, scale, DK, DV, ov);
          if (snap >= 0 || commit_here) {
            std::vector<float> sf(Sd, Sd + SS);
            if (snap >= 0) copy_state(sf.data(), DType::f32, C.at(snap, hv), C.dt, SS);
            if (commit_here) copy_state(sf.data(), DType::f32, target, tgt_dt, SS);
          }
        } else {
          // A single token whose only write is its target goes straight from source to target.
          bool direct = L == 1 && (commit_here || snap >= 0);
          void* out = direct ? (snap >= 0 ? C.at(snap, hv) : target) : Sf;
          DType out_dt = direct ? (snap >= 0 ? C.dt : tgt_dt) : DType::f32;
          const void* in = j == 0 ? src : Sf;
          DType in_dt = j == 0 ? src_dt : DType::f32;
          fast(in, in_dt == DType::bf16, out, out_dt == DType::bf16, qv, kv, vv, alpha, bet, scale, DK, DV, ov, tmp);
          if (!direct) {
            if (snap >= 0) copy_state(Sf, DType::f32, C.at(snap, hv), C.dt, SS);
            if (commit_here) copy_state(Sf, DType::f32, target, tgt_dt, SS);
          }
        }
        store_rows(ov, DV, ot, b, t, 1, hv);
      }
      if (!cache && L == 0 && target) copy_state(src, src_dt, target, tgt_dt, SS);
    }
  });
  r.final_state = state_as(std::move(r.final_state), opt.final_state_dtype, op, "final_state_dtype");
  return r;
}

}  // namespace ot::gdn
