#include "demo_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"

#include "ot/gdn.h"
#include "ot/moe.h"
#include "ot/moe/quant_experts.h"
#include "ot/quant_weights.h"

namespace ot::demo {

// ---- random weights ---------------------------------------------------------------------------

namespace demo_model_local {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Counter-based generator: element i of tensor `id` is a function of (seed, id, i), so weights are
// the same whatever the thread count (and on every MPI rank).
class Init {
 public:
  explicit Init(uint64_t seed) : seed_(seed) {}
  // Uniform with standard deviation `std` (and mean `mean`).
  Tensor uniform(DType dt, const std::vector<int64_t>& shape, double std, double mean = 0) {
    Tensor t = Tensor::empty(dt, shape);
    const uint64_t key = splitmix(seed_ ^ splitmix(++count_));
    const double half = std * std::sqrt(3.0);
    parallel_for(t.numel(), [&](int64_t i0, int64_t i1) {
      std::vector<float> buf(4096);
      for (int64_t i = i0; i < i1; i += 4096) {
        int64_t n = std::min<int64_t>(4096, i1 - i);
        for (int64_t j = 0; j < n; ++j) {
          double u = double(splitmix(key + uint64_t(i + j)) >> 11) * 0x1.0p-53;  // [0, 1)
          buf[size_t(j)] = float(mean + (2 * u - 1) * half);
        }
        convert_from_f32(buf.data(), static_cast<char*>(t.view().data) + size_t(i) * dtype_size(dt), dt, n);
      }
    });
    return t;
  }
  std::vector<float> vec(int64_t n, double lo, double hi) {
    Tensor t = uniform(DType::f32, {n}, (hi - lo) / std::sqrt(12.0), (lo + hi) / 2);
    return {t.ptr<float>(), t.ptr<float>() + n};
  }

 private:
  uint64_t seed_, count_ = 0;
};

}  // namespace demo_model_local

struct Layer {
  // GDN mixer
  std::vector<float> in_norm, o_norm, A_log, dt_bias;
  Tensor A_log_t, dt_bias_t;  // [HV] fp32 views for the fused decode gates
  Tensor o_norm_heads;        // [HV * DV] fp32: o_norm once per value head (the gated norm's weight)
  Linear in_proj, out_proj;
  // MoE FFN
  std::vector<float> post_norm;
  Tensor router_w;                // [E, H]
  Tensor gate, up, down;          // [E, H, I], [E, H, I], [E, I, H] (kept for the reference)
  Tensor sh_gate, sh_up, sh_down; // [1, H, Is] ... (kept for the reference)
  gemm::PackedB router;
  moe::MoeExperts experts, shared;
  moe::MoeExperts local;  // expert parallel: this rank's experts
  // model.moe.expert_weights quantised: the store, and its codes and scales (kept for the reference)
  moe::QuantMoeExperts qexperts;
  QuantizedWeights q_gate_up, q_down;  // [E, H, 2I], [E, I, H]
  moe::QuantMoeExperts qshared;        // the shared expert in the same format (sh_*: its dequantised weights)
};

void Verifier::add(const std::string& op, double err) {
  Entry& e = ops[op];
  ++e.calls;
  e.max_err = std::max(e.max_err, std::isnan(err) ? INFINITY : err);
}

void Isolation::time(const char* name, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const int64_t t0 = trace::now_ns();
    fn();
    ms.push_back((trace::now_ns() - t0) / 1e6);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  Entry& e = ops[name];
  ++e.calls;
  e.ms += ms[ms.size() / 2];
}

int64_t Batch::tokens() const {
  int64_t t = 0;
  for (int64_t l : lengths) t += l;
  return t;
}

// Experts [E, H, I] x2 / [E, I, H] quantised once (symmetric, model.moe.expert_weights): gate and
// up as one [E, H, 2I] tensor, the store's layout; gu / dn: the codes and scales.
static moe::QuantMoeExperts quantised_store(const Tensor& gate, const Tensor& up, const Tensor& down, const ExpertFormat& f, QuantizedWeights& gu,
                                            QuantizedWeights& dn) {
  const int64_t E = gate.size(0), H = gate.size(1), I = gate.size(2);
  Tensor gate_up = Tensor::empty(gate.dtype(), {E, H, 2 * I});
  copy_into(gate, gate_up.view().narrow(2, 0, I));
  copy_into(up, gate_up.view().narrow(2, I, I));
  gu = quantize_weights(gate_up, f.format, f.group_size, true);
  dn = quantize_weights(down, f.format, f.group_size, true);
  return moe::QuantMoeExperts::from_quantized(gu.view(), dn.view(), f.activations);
}

// The routed and the shared experts quantised. keep: the routed codes stay for the reference, and
// the shared expert's weights are replaced by their dequantised values (what the reference reads).
static void quantise_experts(Layer& L, const MoeConfig& c, bool keep) {
  const ExpertFormat f = expert_format(c);
  QuantizedWeights gu, dn;
  L.qexperts = quantised_store(L.gate, L.up, L.down, f, gu, dn);
  if (keep) L.q_gate_up = std::move(gu), L.q_down = std::move(dn);
  if (!L.sh_gate.defined() || !c.quantise_shared_expert) return;
  L.qshared = quantised_store(L.sh_gate, L.sh_up, L.sh_down, f, gu, dn);
  if (!keep) return;
  const int64_t Is = L.sh_gate.size(2);
  Tensor dgu = dequantize_weights(gu.view());
  L.sh_gate = Tensor::copy_of(dgu.view().narrow(2, 0, Is));
  L.sh_up = Tensor::copy_of(dgu.view().narrow(2, Is, Is));
  L.sh_down = dequantize_weights(dn.view());
}

Model::Model(const DemoConfig& cfg, int64_t keep_ref_layers, const ExpertParallel* ep) : cfg_(cfg) {
  if (ep) ep_ = *ep, use_ep_ = true;
  OT_CHECK(!(use_ep_ && cfg.model.moe.quantised()), "ot demo", "model.moe.expert_weights",
           "float under --ep (the expert-parallel layer takes float experts)", cfg.model.moe.expert_weights);
  const ModelConfig& m = cfg.model;
  const int64_t H = m.hidden, HK = m.gdn.key_heads, HV = m.gdn.value_heads, DK = m.gdn.key_head_dim, DV = m.gdn.value_head_dim;
  const int64_t E = m.moe.experts, I = m.moe.intermediate, Is = m.moe.shared_intermediate;
  const DType dt = m.dtype;
  demo_model_local::Init init(cfg.run.seed);
  // Weights ~ 1/sqrt(fan_in); projections into the residual stream are scaled down by
  // 1/sqrt(2 * layers) (GPT-2 style) so the stream stays O(1) through the stack.
  const double res_scale = 1 / std::sqrt(2.0 * double(m.layers));
  embed_ = init.uniform(dt, {m.vocab, H}, 1.0);
  for (int64_t l = 0; l < m.layers; ++l) {
    auto L = std::make_unique<Layer>();
    const bool keep = l < keep_ref_layers;
    L->in_norm = init.vec(H, 0.9, 1.1);
    L->post_norm = init.vec(H, 0.9, 1.1);
    L->o_norm = init.vec(DV, 0.9, 1.1);
    L->o_norm_heads = Tensor::empty(DType::f32, {HV * DV});
    for (int64_t h = 0; h < HV; ++h) std::memcpy(L->o_norm_heads.ptr<float>() + h * DV, L->o_norm.data(), size_t(DV) * 4);
    // HF init: A ~ U(1, 16), dt ~ logU(1e-3, 0.1), dt_bias = softplus^-1(dt).
    L->A_log = init.vec(HV, 0, 1);
    L->dt_bias = init.vec(HV, 0, 1);
    for (int64_t h = 0; h < HV; ++h) {
      L->A_log[size_t(h)] = float(std::log(1 + 15 * L->A_log[size_t(h)]));
      double d = std::exp(std::log(1e-3) + L->dt_bias[size_t(h)] * (std::log(0.1) - std::log(1e-3)));
      L->dt_bias[size_t(h)] = float(d + std::log(-std::expm1(-d)));
    }
    L->A_log_t = Tensor::empty(DType::f32, {HV});
    L->dt_bias_t = Tensor::empty(DType::f32, {HV});
    std::memcpy(L->A_log_t.ptr<float>(), L->A_log.data(), size_t(HV) * 4);
    std::memcpy(L->dt_bias_t.ptr<float>(), L->dt_bias.data(), size_t(HV) * 4);
    const int64_t P = 2 * HK * DK + 2 * HV * DV + 2 * HV;  // [q | k | v | z | b | a]
    L->in_proj = make_linear(init.uniform(dt, {P, H}, 1 / std::sqrt(double(H))), keep);
    L->out_proj = make_linear(init.uniform(dt, {H, HV * DV}, res_scale / std::sqrt(double(HV * DV))), keep);
    L->router_w = init.uniform(dt, {E, H}, 1 / std::sqrt(double(H)));
    L->gate = init.uniform(dt, {E, H, I}, 1 / std::sqrt(double(H)));
    L->up = init.uniform(dt, {E, H, I}, 1 / std::sqrt(double(H)));
    L->down = init.uniform(dt, {E, I, H}, res_scale / std::sqrt(double(I)));
    if (Is > 0) {
      L->sh_gate = init.uniform(dt, {1, H, Is}, 1 / std::sqrt(double(H)));
      L->sh_up = init.uniform(dt, {1, H, Is}, 1 / std::sqrt(double(H)));
      L->sh_down = init.uniform(dt, {1, Is, H}, res_scale / std::sqrt(double(Is)));
    }
    L->router = gemm::prepack(L->router_w.view(), gemm::BLayout::NK);
    // Expert parallel: every rank packs its own shard; the verified layers also keep every expert
    // packed for the single-process comparison.
    if (use_ep_) {
      const int64_t e0 = ep_.expert_begin, n = ep_.expert_end - ep_.expert_begin;
      L->local = moe::MoeExperts::from_stacked(L->gate.view().narrow(0, e0, n), L->up.view().narrow(0, e0, n),
                                               L->down.view().narrow(0, e0, n), moe::WeightLayout::EHI);
    }
    if (m.moe.quantised()) {
      quantise_experts(*L, m.moe, keep);
    } else if (!use_ep_ || keep) {
      L->experts = moe::MoeExperts::from_stacked(L->gate, L->up, L->down, moe::WeightLayout::EHI);
    }
    if (Is > 0 && L->qshared.empty()) L->shared = moe::MoeExperts::from_stacked(L->sh_gate, L->sh_up, L->sh_down, moe::WeightLayout::EHI);
    if (!keep) L->gate = L->up = L->down = L->sh_gate = L->sh_up = L->sh_down = Tensor();
    layers_.push_back(std::move(L));
  }
  final_norm_ = init.uniform(DType::f32, {H}, 0.05, 1.0);
  lm_head_ = make_linear(init.uniform(dt, {m.vocab, H}, 1 / std::sqrt(double(H))), keep_ref_layers > 0);
}

Model::~Model() = default;

void Model::reset_cache(int64_t slots) {
  const auto& g = cfg_.model.gdn;
  cache_.clear();
  for (size_t l = 0; l < layers_.size(); ++l)
    cache_.push_back(Tensor::zeros(DType::f32, {slots, g.value_heads, g.key_head_dim, g.value_head_dim}));
}

std::vector<Work> Model::take_work() {
  std::vector<Work> w;
  w.swap(work_);
  return w;
}

// ---- one step ----------------------------------------------------------------------------------

namespace demo_model_local {

// out = the linear through the fast engine, checked against the reference GEMM when verifying.
void checked_linear(const char* name, const TensorView& x, const Linear& w, const TensorView& out, bool accumulate, Verifier* v,
                    Isolation* iso) {
  if (v) {
    Tensor fast = Tensor::empty(out.dtype, {x.size(0), w.out}), ref = Tensor::empty(out.dtype, {x.size(0), w.out});
    linear(name, x, w, fast);
    linear_ref(x, w, ref);
    v->add(std::string(name) + " (gemm)", normalised_error(fast, ref));
  }
  if (iso && accumulate) {
    // The repeats accumulate into a copy: the step's own output gets the one pipeline call.
    Tensor copy = Tensor::copy_of(out);
    iso->time(name, [&] { linear(name, x, w, copy, true); });
  }
  linear(name, x, w, out, accumulate);
  if (iso && !accumulate) iso->time(name, [&] { linear(name, x, w, out); });
}

// rms_norm(x), checked against the plain form when verifying.
Tensor checked_rms_norm(const TensorView& x, const float* w, double eps, Verifier* v, Isolation* iso) {
  Tensor out = rms_norm(x, w, eps);
  if (iso) iso->time("rms_norm", [&] { rms_norm(x, w, eps); });
  if (v) {
    Tensor ref = Tensor::empty(out.dtype(), out.shape());
    rms_norm_ref(x, w, eps, ref);
    v->add("rms_norm", normalised_error(out, ref));
  }
  return out;
}

// Columns [col, col + width) of a [T, P] tensor as a [T, width] view.
TensorView columns(const Tensor& t, int64_t col, int64_t width) {
  const int64_t P = t.size(1);
  return TensorView(static_cast<char*>(t.view().data) + size_t(col) * dtype_size(t.dtype()), t.dtype(), {t.size(0), width}, {P, 1});
}

// 4-D [B, T, heads, dim] view of columns of a [rows, P] projection (rows = B * T).
[[maybe_unused]] TensorView heads_view(const Tensor& t, int64_t col, int64_t B, int64_t T, int64_t heads, int64_t dim) {
  const int64_t P = t.size(1);
  return TensorView(static_cast<char*>(t.view().data) + size_t(col) * dtype_size(t.dtype()), t.dtype(), {B, T, heads, dim},
                    {T * P, P, dim, 1});
}

}  // namespace demo_model_local

// The step's activations come from the output pool (like the operators' own outputs): a fresh
// [763, 3088] in_proj output per layer faulted in its pages inside the GEMM, a third of its time.
void Model::mixer(Layer& L, int64_t l, Tensor& x, const Batch& batch, bool prefill, Verifier* v) {
  using namespace demo_model_local;
  const ModelConfig& m = cfg_.model;
  const int64_t T = x.size(0), HK = m.gdn.key_heads, HV = m.gdn.value_heads, DK = m.gdn.key_head_dim,
                DV = m.gdn.value_head_dim;
  const DType dt = m.dtype;
  Tensor xn = checked_rms_norm(x, L.in_norm.data(), m.rms_norm_eps, v, iso_);
  Tensor proj = pooled_empty(dt, {T, L.in_proj.out});
  checked_linear("in_proj", xn, L.in_proj, proj, false, v, iso_);
  const int64_t cq = 0, ck = HK * DK, cv = 2 * HK * DK, cz = cv + HV * DV, cb = cz + HV * DV, ca = cb + HV;
  Tensor o;  // [T, HV, DV]
  const int64_t N = int64_t(batch.lengths.size());
  if (prefill) {
    Tensor g = Tensor::empty(DType::f32, {1, T, HV}), beta = Tensor::empty(DType::f32, {1, T, HV});
    gdn_gates(columns(proj, ca, HV), columns(proj, cb, HV), L.A_log.data(), L.dt_bias.data(), g.view().reshape({T, HV}),
              beta.view().reshape({T, HV}));
    if (iso_)
      iso_->time("gdn_gates", [&] {
        gdn_gates(columns(proj, ca, HV), columns(proj, cb, HV), L.A_log.data(), L.dt_bias.data(), g.view().reshape({T, HV}),
                  beta.view().reshape({T, HV}));
      });
    gdn::ChunkOptions opt;
    opt.cu_seqlens = cu_seqlens_;
    opt.seq = seq_.get();
    opt.use_qk_l2norm_in_kernel = true;
    opt.output_final_state = true;
    opt.save_for_backward = false;
    auto q = heads_view(proj, cq, 1, T, HK, DK), k = heads_view(proj, ck, 1, T, HK, DK), vv = heads_view(proj, cv, 1, T, HV, DV);
    gdn::ChunkFwd r = gdn::chunk_gated_delta_rule_fwd(q, k, vv, g, beta, opt);
    work_.push_back(gdn_prefill_work(batch));
    if (iso_) iso_->time("chunk_gated_delta_rule_fwd", [&] { gdn::chunk_gated_delta_rule_fwd(q, k, vv, g, beta, opt); });
    if (v) {
      cpu::ScopedForceRef force(true);
      gdn::ChunkFwd rr = gdn::chunk_gated_delta_rule_fwd(q, k, vv, g, beta, opt);
      v->add("chunk_gated_delta_rule_fwd (o)", normalised_error(r.o, rr.o));
      v->add("chunk_gated_delta_rule_fwd (state)", normalised_error(r.final_state, rr.final_state));
    }
    store_states(r.final_state, batch.slots, cache_[size_t(l)]);
    if (iso_) iso_->time("gdn_cache_store", [&] { store_states(r.final_state, batch.slots, cache_[size_t(l)]); });
    o = r.o;
  } else {
    Tensor idx = Tensor::empty(DType::i32, {N});
    std::memcpy(idx.ptr<int32_t>(), batch.slots.data(), size_t(N) * 4);
    gdn::RecurrentOptions opt;
    opt.use_qk_l2norm_in_kernel = true;
    opt.state_cache = cache_[size_t(l)];
    opt.state_indices = idx;
    opt.A_log = L.A_log_t;
    opt.dt_bias = L.dt_bias_t;
    opt.beta_sigmoid = true;
    auto q = heads_view(proj, cq, N, 1, HK, DK), k = heads_view(proj, ck, N, 1, HK, DK), vv = heads_view(proj, cv, N, 1, HV, DV);
    // Raw gate inputs a, b: the operator applies the fused gate and sigmoid.
    const TensorView a2 = columns(proj, ca, HV), b2 = columns(proj, cb, HV);
    const TensorView a3(a2.data, dt, {N, 1, HV}, {a2.stride(0), a2.stride(0), 1}), b3(b2.data, dt, {N, 1, HV}, {b2.stride(0), b2.stride(0), 1});
    Tensor before;
    if (v || iso_) before = Tensor::copy_of(cache_[size_t(l)]);
    gdn::RecurrentOut r = gdn::recurrent_gated_delta_rule(q, k, vv, a3, b3, opt);
    work_.push_back({"recurrent_gated_delta_rule", 7.0 * N * HV * DK * DV, 2.0 * N * HV * DK * DV * 4});
    if (iso_) {
      // The repeats update a copy of the cache (taken before the step) in place.
      gdn::RecurrentOptions io = opt;
      io.state_cache = Tensor::copy_of(before);
      iso_->time("recurrent_gated_delta_rule", [&] { gdn::recurrent_gated_delta_rule(q, k, vv, a3, b3, io); });
    }
    if (v) {
      cpu::ScopedForceRef force(true);
      opt.state_cache = before;
      gdn::RecurrentOut rr = gdn::recurrent_gated_delta_rule(q, k, vv, a3, b3, opt);
      v->add("recurrent_gated_delta_rule (o)", normalised_error(r.o, rr.o));
      v->add("recurrent_gated_delta_rule (state)", normalised_error(cache_[size_t(l)], before));
    }
    o = r.o;
  }
  TensorView o3 = o.view().reshape({T, HV, DV});
  Tensor y = gated_rms_norm(o3, columns(proj, cz, HV * DV), L.o_norm_heads, m.rms_norm_eps);
  if (iso_) iso_->time("gated_rms_norm", [&] { gated_rms_norm(o3, columns(proj, cz, HV * DV), L.o_norm_heads, m.rms_norm_eps); });
  if (v) {
    Tensor ref = Tensor::empty(dt, {T, HV * DV});
    gated_rms_norm_ref(o3, columns(proj, cz, HV * DV), L.o_norm.data(), m.rms_norm_eps, ref);
    v->add("gated_rms_norm", normalised_error(y, ref));
  }
  checked_linear("out_proj", y, L.out_proj, x, true, v, iso_);
}

// FLOPs: router 2THE, routed experts 6 T K H I, shared expert 6 T H Is. Bytes: the router, the
// experts that received tokens (decode reads only those), the shared expert, x in, residual, y out.
static Work moe_work(const ModelConfig& m, const moe::MoeFfnResult& r, int64_t T, const moe::QuantMoeExperts& q, const moe::QuantMoeExperts& shared_q) {
  const double H = double(m.hidden), I = double(m.moe.intermediate), Is = double(m.moe.shared_intermediate),
               E = double(m.moe.experts), es = double(dtype_size(m.dtype));
  int64_t touched = 0;
  for (int64_t e = 0; e < m.moe.experts; ++e) touched += r.expert_counts.ptr<int64_t>()[e] > 0;
  const double flops = 2 * T * H * E + 6.0 * T * double(m.moe.top_k) * H * I + 6.0 * T * H * Is;
  const double expert_bytes = m.moe.quantised() ? double(q.expert_bytes()) : 3 * H * I * es;  // packed, scales included
  const double shared_bytes = shared_q.empty() ? 3 * H * Is * es : double(shared_q.expert_bytes());
  const double bytes = (E * H + 3.0 * T * H) * es + shared_bytes + double(touched) * expert_bytes;
  return {"moe_ffn", flops, bytes};
}

void Model::ffn(Layer& L, Tensor& x, Verifier* v) {
  const ModelConfig& m = cfg_.model;
  const int64_t T = x.size(0);
  Tensor xn = demo_model_local::checked_rms_norm(x, L.post_norm.data(), m.rms_norm_eps, v, iso_);
  if (use_ep_) return ffn_ep(L, x, xn, v);
  moe::MoeFfnOptions opt;
  opt.k = m.moe.top_k;
  opt.router = moe::RouterKind::softmax_topk;
  opt.norm_topk_prob = m.moe.norm_topk_prob;
  const bool quant = m.moe.quantised();
  if (!L.qshared.empty()) opt.shared_quant = &L.qshared;  // (only built with a shared expert)
  else if (m.moe.shared_intermediate > 0) opt.shared = &L.shared;
  opt.residual = x;
  auto layer = [&](const moe::MoeFfnOptions& o) { return quant ? moe::moe_ffn(xn, L.router, L.qexperts, o) : moe::moe_ffn(xn, L.router, L.experts, o); };
  moe::MoeFfnResult r = layer(opt);
  work_.push_back(moe_work(m, r, T, L.qexperts, L.qshared));
  if (iso_) iso_->time("moe_ffn", [&] { layer(opt); });
  if (v) {
    // Compared without the residual, so the error is relative to the FFN's own output. The
    // reference reads the shared expert's unpacked weights (opt.shared only says there is one);
    // quantised experts: it dequantises their codes, then multiplies.
    moe::MoeFfnOptions no_res = opt;
    no_res.residual = TensorView();
    moe::MoeFfnResult f = layer(no_res);
    moe::MoeFfnResult rr = quant ? moe::ref::moe_ffn(xn, L.router_w, L.q_gate_up.view(), L.q_down.view(), no_res, L.sh_gate, L.sh_up, L.sh_down,
                                                     L.qexperts.activation_quant())
                                 : moe::ref::moe_ffn(xn, L.router_w, L.gate, L.up, L.down, no_res, L.sh_gate, L.sh_up, L.sh_down);
    v->add("moe_ffn", normalised_error(f.y, rr.y));
  }
  x = r.y;
}

// Expert-parallel MoE layer: route this rank's tokens (router GEMM, top-k softmax, norm_topk_prob as
// in moe_ffn), residual + shared expert into an fp32 base here, routed experts over the ranks.
void Model::ffn_ep(Layer& L, Tensor& x, const Tensor& xn, Verifier* v) {
  const ModelConfig& m = cfg_.model;
  const int64_t T = x.size(0), H = m.hidden, E = m.moe.experts, K = m.moe.top_k;
  trace::OpScope scope("moe_ffn_ep");
  scope.kernel("ep_moe_ffn").args(detail::cat(xn.view().shape_str(), " E=", E, " K=", K, " ranks=", ep_.world));
  Tensor logits = Tensor::empty(DType::f32, {T, E});
  gemm::gemm(T, {xn.view().data, xn.dtype(), H, nullptr}, L.router, {logits.view().data, DType::f32, E});
  moe::GatingResult g = moe::moe_gating_top_k_softmax(logits, K);
  if (m.moe.norm_topk_prob) {
    float* w = g.y.ptr<float>();
    for (int64_t t = 0; t < T; ++t) {
      float s = 0;
      for (int64_t j = 0; j < K; ++j) s += w[t * K + j];
      for (int64_t j = 0; j < K; ++j) w[t * K + j] /= s;
    }
  }
  // base = [residual +] shared expert, fp32 (combine adds it to the routed sum before the one cast).
  auto base_of = [&](bool residual) {
    Tensor b = residual ? Tensor::empty(DType::f32, {T, H}) : Tensor::zeros(DType::f32, {T, H});
    if (residual) copy_into(x, b);
    if (m.moe.shared_intermediate > 0 && T > 0) {
      moe::ExpertRows all;
      all.offsets = {0, T};
      moe::moe_expert_ffn(xn, L.shared, all, b, true);
    }
    return b;
  };
  if (v) {
    // The expert-parallel layer (without the residual) against one process's moe_ffn on every
    // rank's tokens, and that moe_ffn against the reference on this rank's tokens.
    moe::MoeFfnOptions opt;
    opt.k = K;
    opt.router = moe::RouterKind::softmax_topk;
    opt.norm_topk_prob = m.moe.norm_topk_prob;
    opt.shared = m.moe.shared_intermediate > 0 ? &L.shared : nullptr;
    Tensor ep_y = ep_.routed(L.local, xn, g.expert_idx, g.y, base_of(false));
    int64_t first = 0;
    Tensor all = ep_.gather(xn, &first);
    moe::MoeFfnResult one = moe::moe_ffn(all, L.router, L.experts, opt);
    v->add("moe_ffn (expert parallel vs 1 process)", normalised_error(ep_y, one.y.view().narrow(0, first, T)));
    moe::MoeFfnResult f = moe::moe_ffn(xn, L.router, L.experts, opt);
    moe::MoeFfnResult rr = moe::ref::moe_ffn(xn, L.router_w, L.gate, L.up, L.down, opt, L.sh_gate, L.sh_up, L.sh_down);
    v->add("moe_ffn", normalised_error(f.y, rr.y));
  }
  x = ep_.routed(L.local, xn, g.expert_idx, g.y, base_of(true));
  // This rank's share: its tokens' router, routed and shared expert FLOPs.
  const double I = double(m.moe.intermediate), Is = double(m.moe.shared_intermediate), es = double(dtype_size(m.dtype));
  scope.flops(2.0 * T * H * E + 6.0 * T * K * H * I + 6.0 * T * H * Is)
      .bytes((double(E) * H + double(L.local.num_experts()) * 3 * H * I + 3 * H * Is + 3.0 * T * H) * es);
}

std::vector<int32_t> Model::step(const std::vector<int32_t>& tokens, const Batch& batch, bool prefill, Verifier* v, int64_t layers) {
  using namespace demo_model_local;
  const ModelConfig& m = cfg_.model;
  const int64_t T = int64_t(tokens.size()), N = int64_t(batch.lengths.size());
  OT_CHECK(T == batch.tokens(), "ot demo", "tokens", detail::cat(batch.tokens(), " tokens"), T);
  Tensor x = pooled_empty(m.dtype, {T, m.hidden});
  embedding(embed_, tokens, x);
  if (iso_) iso_->time("embedding", [&] { embedding(embed_, tokens, x); });
  const int64_t nl = layers < 0 ? num_layers() : std::min(layers, num_layers());
  if (prefill) {
    cu_seqlens_ = Tensor::empty(DType::i64, {N + 1});
    int64_t* cu = cu_seqlens_.ptr<int64_t>();
    cu[0] = 0;
    for (int64_t n = 0; n < N; ++n) cu[n + 1] = cu[n] + batch.lengths[size_t(n)];
    seq_ = std::make_unique<gdn::SeqInfo>(gdn::make_seq_info(1, T, cu_seqlens_, "ot demo"));
  }
  for (int64_t l = 0; l < nl; ++l) {
    Layer& L = *layers_[size_t(l)];
    mixer(L, l, x, batch, prefill, v);
    ffn(L, x, v);
  }
  // Head on the last token of every sequence.
  std::vector<int64_t> last;
  int64_t end = 0;
  for (int64_t n = 0; n < N; ++n) last.push_back((end += batch.lengths[size_t(n)]) - 1);
  Tensor h = Tensor::empty(m.dtype, {N, m.hidden});
  gather_rows(x, last, h);
  if (iso_) iso_->time("gather_rows", [&] { gather_rows(x, last, h); });
  Tensor hn = checked_rms_norm(h, final_norm_.ptr<float>(), m.rms_norm_eps, v, iso_);
  Tensor logits = pooled_empty(DType::f32, {N, m.vocab});
  checked_linear("lm_head", hn, lm_head_, logits, false, v, iso_);
  std::vector<int32_t> next = argmax_rows(logits);
  if (iso_) iso_->time("argmax", [&] { argmax_rows(logits); });
  if (v) {  // the chunked argmax against std::max_element (the first largest): error 1 on any other token
    const float* lp = logits.ptr<float>();
    bool same = true;
    for (int64_t n = 0; n < N; ++n) same &= next[size_t(n)] == int32_t(std::max_element(lp + n * m.vocab, lp + (n + 1) * m.vocab) - (lp + n * m.vocab));
    v->add("argmax", same ? 0.0 : 1.0);
  }
  return next;
}

}  // namespace ot::demo

namespace ot::demo {

// The GDN spec's forward count (section 11), per (sequence, value head) and chunk of length C:
// 6 C^2 K + 4 C^2 V + 6 C K V + C^3 / 3. Bytes: q, k, v, o once and the final states.
Work Model::gdn_prefill_work(const Batch& batch) const {
  const auto& g = cfg_.model.gdn;
  const double K = double(g.key_head_dim), V = double(g.value_head_dim), es = double(dtype_size(cfg_.model.dtype));
  double flops = 0;
  for (int64_t len : batch.lengths)
    for (int64_t c0 = 0; c0 < len; c0 += 64) {
      double C = double(std::min<int64_t>(64, len - c0));
      flops += double(g.value_heads) * (6 * C * C * K + 4 * C * C * V + 6 * C * K * V + C * C * C / 3);
    }
  const double T = double(batch.tokens()), N = double(batch.lengths.size());
  double bytes = T * es * (2 * double(g.key_heads) * K + 2 * double(g.value_heads) * V) + N * double(g.value_heads) * K * V * 4;
  return {"chunk_gated_delta_rule_fwd", flops, bytes};
}

}  // namespace ot::demo
