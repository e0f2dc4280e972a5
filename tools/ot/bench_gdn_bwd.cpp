// ot bench gdn_chunk_bwd: chunk_gated_delta_rule_bwd at Qwen3.5 shapes (HK 16, HV 32, DK = DV = 128).
// Reports GFLOP/s by the spec's backward formula (section 11, recompute of W, U, h included), the
// time of our chunked forward at the same shape (bwd/fwd ratio; target <= 3x), and the speed-up
// over the fp64 reference (the token recurrence differentiated exactly). The reference is slow:
// it is timed on a slice (the first key head and its value heads, the first tokens of each
// sequence) and scaled linearly in heads and tokens, which is exact for a token recurrence.
#include <ctime>
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "bench_harness.h"
#include "ot/gdn.h"
#include "ot/gdn_bwd.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/gdn/gdn_bwd_common.h"

namespace ot::cli {
namespace bench_gdn_bwd_local {

struct GdnCase {
  std::string name;
  int64_t B, T;
  std::vector<int64_t> cu;  // varlen when non-empty (B = 1)
};

std::vector<GdnCase> cases() {
  return {{"qwen35-B1-T1024", 1, 1024, {}},
          {"qwen35-B1-T4096", 1, 4096, {}},
          {"qwen35-B4-T1024", 4, 1024, {}},
          // The forward benchmark's mixed batch: lengths 1000, 37, 1, 2048, 500, 510.
          {"qwen35-varlen", 1, 4096, {0, 1000, 1037, 1038, 3086, 3586, 4096}}};
}

// Process CPU time (all threads) of one call, ms. On a shared, overloaded machine the CPU time of a
// 1-thread run is the contention-free estimate of its wall time.
double cpu_ms_of(const std::function<void()>& fn) {
  timespec a, b;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  fn();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  return (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
}
double median_cpu_ms(const std::function<void()>& fn, int repeats) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(cpu_ms_of(fn));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

constexpr int64_t HK = 16, HV = 32, DK = 128, DV = 128;

struct Data {
  Tensor q, k, v, g, beta, dO, h0, dht, cu;
};

Tensor rnd(DType dt, const std::vector<int64_t>& shape, float s, std::mt19937& rng) {
  std::normal_distribution<float> n01;
  Tensor t = Tensor::empty(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = s * n01(rng);
  if (dt == DType::f32) return t;
  Tensor o = Tensor::empty(dt, shape);
  copy_into(t, o);
  return o;
}

Data make(const GdnCase& c, DType dt) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  bool packed = !c.cu.empty();
  auto shp = [&](std::vector<int64_t> s) {
    if (packed) s.erase(s.begin());
    return s;
  };
  Data d;
  d.q = rnd(dt, shp({c.B, c.T, HK, DK}), 1.f, rng);
  d.k = rnd(dt, shp({c.B, c.T, HK, DK}), 1.f, rng);
  d.v = rnd(dt, shp({c.B, c.T, HV, DV}), 1.f, rng);
  d.dO = rnd(dt, shp({c.B, c.T, HV, DV}), 1.f, rng);
  d.g = Tensor::empty(DType::f32, shp({c.B, c.T, HV}));
  d.beta = Tensor::empty(DType::f32, shp({c.B, c.T, HV}));
  for (int64_t i = 0; i < d.g.numel(); ++i) {
    d.g.ptr<float>()[i] = std::log(u01(rng) * 0.5f + 0.5f) * 0.2f;  // log-sigmoid-like decays
    d.beta.ptr<float>()[i] = u01(rng);
  }
  int64_t N = packed ? int64_t(c.cu.size()) - 1 : c.B;
  d.h0 = rnd(DType::f32, {N, HV, DK, DV}, 0.1f, rng);
  d.dht = rnd(DType::f32, {N, HV, DK, DV}, 0.1f, rng);
  if (packed) {
    d.cu = Tensor::empty(DType::i64, {int64_t(c.cu.size())});
    for (size_t i = 0; i < c.cu.size(); ++i) d.cu.ptr<int64_t>()[i] = c.cu[i];
  }
  return d;
}

// The reference on a slice: key head 0 and its value heads, the first `tok` tokens of every
// sequence. Returns the slice's token count (for the linear scaling).
double time_ref_slice(const GdnCase& c, const Data& d, int64_t tok, int64_t* slice_tokens) {
  const int64_t G = HV / HK;
  bool packed = !c.cu.empty();
  std::vector<int64_t> cu{0};
  int64_t total = 0;
  if (packed) {
    for (size_t n = 0; n + 1 < c.cu.size(); ++n) cu.push_back(cu.back() + std::min(tok, c.cu[n + 1] - c.cu[n]));
    total = cu.back();
  } else {
    total = c.B * std::min(tok, c.T);
  }
  *slice_tokens = total;
  // Gather the slice into contiguous tensors (outside the timed region).
  int64_t Bs = packed ? 1 : c.B, Ts = packed ? total : std::min(tok, c.T);
  auto take = [&](const Tensor& x, int64_t H0, int64_t D) {
    std::vector<int64_t> shape = packed ? std::vector<int64_t>{Ts, H0} : std::vector<int64_t>{Bs, Ts, H0};
    if (D) shape.push_back(D);
    Tensor o = Tensor::empty(x.dtype(), shape);
    int64_t Hx = x.size(packed ? 1 : 2), Dx = D ? D : 1, i = 0;
    for (int64_t b = 0; b < Bs; ++b)
      for (int64_t t = 0; t < Ts; ++t) {
        int64_t src_t = t;
        if (packed) {
          size_t n = 0;
          while (cu[n + 1] <= t) ++n;
          src_t = c.cu[n] + (t - cu[n]);
        }
        for (int64_t h = 0; h < H0; ++h)
          for (int64_t e = 0; e < Dx; ++e, ++i) set_from_double(o, i, get_as_double(x, ((b * c.T + src_t) * Hx + h) * Dx + e));
      }
    return o;
  };
  Tensor q = take(d.q, 1, DK), k = take(d.k, 1, DK), v = take(d.v, G, DV), dO = take(d.dO, G, DV), g = take(d.g, G, 0), beta = take(d.beta, G, 0);
  int64_t N = packed ? int64_t(cu.size()) - 1 : c.B;
  Tensor h0 = Tensor::empty(DType::f32, {N, G, DK, DV}), dht = Tensor::empty(DType::f32, {N, G, DK, DV});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < G * DK * DV; ++i) {
      h0.ptr<float>()[n * G * DK * DV + i] = d.h0.ptr<float>()[n * HV * DK * DV + i];
      dht.ptr<float>()[n * G * DK * DV + i] = d.dht.ptr<float>()[n * HV * DK * DV + i];
    }
  Tensor cut;
  gdn::ChunkBwdOptions o;
  if (packed) {
    cut = Tensor::empty(DType::i64, {int64_t(cu.size())});
    for (size_t i = 0; i < cu.size(); ++i) cut.ptr<int64_t>()[i] = cu[i];
    o.cu_seqlens = cut;
  }
  o.initial_state = h0, o.dht = dht, o.use_qk_l2norm_in_kernel = true;
  return time_median_ms([&] { gdn::ref::recurrence_bwd(q, k, v, g, beta, dO, o); }, 1);
}

int run(const BenchOptions& opt, const std::string& dtype, int ref_tokens) {
  DType dt = dtype == "fp32" ? DType::f32 : DType::bf16;
  int repeats = opt.repeats > 0 ? opt.repeats : 3;
  for (const GdnCase& c : cases()) {
    if (!opt.selected(c.name)) continue;
    Data d = make(c, dt);
    // Sequence metadata derived once and reused by every call (as a training step would).
    gdn::SeqInfo s = gdn::make_seq_info(d.cu.defined() ? 1 : c.B, c.T, d.cu.defined() ? d.cu.view() : TensorView{});
    gdn::ChunkOptions fo;
    fo.seq = &s;
    fo.initial_state = d.h0;
    fo.use_qk_l2norm_in_kernel = true;
    fo.save_for_backward = true;
    gdn::ChunkFwd fwd = gdn::chunk_gated_delta_rule_fwd(d.q, d.k, d.v, d.g, d.beta, fo);
    gdn::ChunkBwdOptions bo;
    bo.seq = &s;
    bo.initial_state = d.h0, bo.dht = d.dht, bo.use_qk_l2norm_in_kernel = true, bo.A = fwd.A;
    double flops = gdn::detail::bwd_flops(s, HV, DK, DV);
    // bwd and fwd interleaved so both see the same machine state. The training pair: the forward
    // saves h and v_new (save_states) and the backward takes them; the recomputing backward (the
    // forward saving only g_cumsum and A) is timed against the same forward in a second pass.
    gdn::ChunkOptions fs = fo;
    fs.save_states = true;
    gdn::ChunkFwd fwd_s = gdn::chunk_gated_delta_rule_fwd(d.q, d.k, d.v, d.g, d.beta, fs);
    gdn::ChunkBwdOptions bs = bo;
    bs.h = fwd_s.h, bs.v_new = fwd_s.v_new;
    auto bwd = [&] { gdn::chunk_gated_delta_rule_bwd(d.q, d.k, d.v, fwd_s.g_cumsum, d.beta, d.dO, bs); };
    auto fwd_call = [&] { gdn::chunk_gated_delta_rule_fwd(d.q, d.k, d.v, d.g, d.beta, fs); };
    auto bwd_recompute = [&] { gdn::chunk_gated_delta_rule_bwd(d.q, d.k, d.v, fwd.g_cumsum, d.beta, d.dO, bo); };
    auto fwd_plain = [&] { gdn::chunk_gated_delta_rule_fwd(d.q, d.k, d.v, d.g, d.beta, fo); };
    gdn::ChunkBwdOptions bb = bs;  // the opt-in bf16 products (bf16 inputs only)
    bb.bf16_compute = true;
    auto bwd_bf16 = [&] { gdn::chunk_gated_delta_rule_bwd(d.q, d.k, d.v, fwd_s.g_cumsum, d.beta, d.dO, bb); };
    Timing t = time_interleaved(bwd, fwd_call, repeats, repeats);
    Timing tr = time_interleaved(bwd_recompute, fwd_plain, repeats, repeats);
    Timing tb = time_interleaved(bwd_bf16, fwd_call, repeats, repeats);
    double bwd_cpu = median_cpu_ms(bwd, repeats), fwd_cpu = median_cpu_ms(fwd_call, repeats);
    BenchResult r;
    r.name = c.name;
    r.shape = ot::detail::cat("B", c.B, " T", c.T, " HK", HK, " HV", HV, " D", DK);
    r.dtype = dtype;
    r.threads = num_threads();
    r.ms = t.fast_ms;
    r.gflops = flops / (t.fast_ms * 1e6);
    double peak = matrix_peak_gflops("fp32", r.threads);
    r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
    r.kernel = gemm::kernel_name(DType::f32, DType::f32, gdn::kChunk);
    r.extra["fwd_ms"] = t.ref_ms;
    r.extra["bwd_over_fwd"] = t.ref_ms > 0 ? t.fast_ms / t.ref_ms : 0;
    r.extra["fwd_plus_bwd_ms"] = t.fast_ms + t.ref_ms;
    r.extra["bwd_cpu_ms"] = bwd_cpu;
    r.extra["bwd_recompute_ms"] = tr.fast_ms;
    r.extra["fwd_plain_ms"] = tr.ref_ms;
    r.extra["bwd_bf16_products_ms"] = tb.fast_ms;
    const double state_mib = double(fwd_s.h.view().nbytes() + fwd_s.v_new.view().nbytes()) / (1 << 20);
    r.extra["saved_state_mib"] = state_mib;
    r.extra["fwd_cpu_ms"] = fwd_cpu;
    if (!opt.no_ref) {
      int64_t slice_tokens = 0;
      double slice_ms = time_ref_slice(c, d, ref_tokens, &slice_tokens);
      r.ref_ms = slice_ms * double(HK) * double(c.B * c.T) / double(slice_tokens);
      r.extra["ref_slice_ms"] = slice_ms;
      r.extra["ref_slice"] = ot::detail::cat("1 of ", HK, " key heads, ", slice_tokens, " of ", c.B * c.T, " tokens; ref_ms scaled linearly");
    }
    report(opt, r);
    if (!opt.json)
      std::printf("    fwd (saving h, v_new: %.0f MiB) %.3f ms, bwd/fwd %.2fx, fwd+bwd %.3f ms; process CPU time bwd %.3f ms, fwd %.3f ms%s\n"
                  "    recomputing bwd %.3f ms, over the plain fwd (%.3f ms) %.2fx, fwd+bwd %.3f ms\n"
                  "    bwd with bf16 products (bf16_compute, opt-in) %.3f ms, over the saving fwd (%.3f ms) %.2fx\n",
                  state_mib, t.ref_ms, t.fast_ms / t.ref_ms, t.fast_ms + t.ref_ms, bwd_cpu, fwd_cpu,
                  opt.no_ref ? "" : "; ref_ms extrapolated from a 1-key-head, first-tokens slice", tr.fast_ms, tr.ref_ms, tr.fast_ms / tr.ref_ms,
                  tr.fast_ms + tr.ref_ms, tb.fast_ms, tb.ref_ms, tb.fast_ms / tb.ref_ms);
  }
  return 0;
}

RegisterBench reg("chunk_gated_delta_rule_bwd", "Gated DeltaNet chunked backward at Qwen3.5 shapes",
                  [](Options& sub, const BenchOptions& common) -> std::function<int()> {
                    auto dtype = std::make_shared<std::string>("bf16");
                    auto ref_tokens = std::make_shared<int>(128);
                    sub.choice("--dtype", *dtype, {"bf16", "fp32"}, "q, k, v, dO dtype: bf16 or fp32");
                    sub.value("--ref-tokens", *ref_tokens, "Tokens per sequence in the reference's timed slice");
                    return [&common, dtype, ref_tokens] { return run(common, *dtype, *ref_tokens); };
                  },
                  {"gdn_chunk_bwd"});

}  // namespace bench_gdn_bwd_local
}  // namespace ot::cli
