// Forward and backward of the `ot train-moe` model (see train_moe_model.h).
#include "train_moe_model.h"

#include <cmath>
#include <cstring>

#include "ot/gemm.h"
#include "ot/parallel.h"

namespace ot::cli::train {

using gemm::MatView;
using gemm::MutMatView;

void Param::init(const std::vector<int64_t>& shape, std::mt19937_64& rng, float scale, bool decay_) {
  w = Tensor::empty(DType::f32, shape);
  g = Tensor::zeros(DType::f32, shape);
  m = Tensor::zeros(DType::f32, shape);
  v = Tensor::zeros(DType::f32, shape);
  decay = decay_;
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] = scale < 0 ? 1.f : scale * d(rng);  // scale < 0: ones (norm gains)
}
void Param::zero_grad() { std::memset(g.view().data, 0, g.view().nbytes()); }

std::vector<Param*> Model::params() {
  std::vector<Param*> p{&emb, &nf, &head};
  for (auto& b : blocks)
    for (Param* q : {&b.n1, &b.conv, &b.mix, &b.n2, &b.router, &b.gate, &b.up, &b.down}) p.push_back(q);
  return p;
}

void Model::init(const ModelConfig& c, uint64_t seed) {
  cfg = c;
  std::mt19937_64 rng(seed);
  const int64_t D = c.dim, I = c.inter, E = c.experts;
  const float sd = 1.f / std::sqrt(float(D)), si = 1.f / std::sqrt(float(I)), depth = 1.f / std::sqrt(2.f * float(c.layers));
  emb.init({c.vocab, D}, rng, 1.f, false);
  nf.init({D}, rng, -1, false);
  head.init({D, c.vocab}, rng, sd);
  blocks.resize(size_t(c.layers));
  for (auto& b : blocks) {
    b.n1.init({D}, rng, -1, false);
    b.conv.init({c.window, D}, rng, 1.f / float(c.window), false);
    b.mix.init({D, D}, rng, sd * depth);
    b.n2.init({D}, rng, -1, false);
    b.router.init({E, D}, rng, sd);
    b.gate.init({E, D, I}, rng, sd);
    b.up.init({E, D, I}, rng, sd);
    b.down.init({E, I, D}, rng, si * depth);
  }
}

namespace train_moe_model_local {

// y = x / rms(x) * gain per row; keeps 1/rms for the backward.
void rmsnorm(const float* x, const float* gain, float* y, float* rinv, int64_t T, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(x[t * D + d]) * x[t * D + d];
    rinv[t] = float(1.0 / std::sqrt(s / double(D) + 1e-6));
    for (int64_t d = 0; d < D; ++d) y[t * D + d] = x[t * D + d] * rinv[t] * gain[d];
  }
}
// dx += d rmsnorm; dgain += sum_t dy * xhat.
void rmsnorm_backward(const float* x, const float* gain, const float* rinv, const float* dy, float* dx, float* dgain, int64_t T, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) {
      float xh = x[t * D + d] * rinv[t];
      dgain[d] += dy[t * D + d] * xh;
      dot += double(dy[t * D + d]) * gain[d] * xh;
    }
    for (int64_t d = 0; d < D; ++d) {
      float xh = x[t * D + d] * rinv[t];
      dx[t * D + d] += rinv[t] * (dy[t * D + d] * gain[d] - xh * float(dot / double(D)));
    }
  }
}

Tensor to_dtype(const TensorView& v, DType t) {
  Tensor r = Tensor::empty(t, v.shape());
  copy_into(v, r);
  return r;
}
Tensor f32(const std::vector<int64_t>& shape) { return Tensor::zeros(DType::f32, shape); }

struct BlockCache {
  Tensor x_in, u, r1, c, x_mid, v, r2, v_c;  // v_c: v in the compute dtype
  Tensor gate_c, up_c, down_c, router_c;
  moe::MoeFfnSaved saved;
};

moe::MoeFfnOptions moe_options(const ModelConfig& c) {
  moe::MoeFfnOptions o;
  o.k = c.topk;
  o.router = moe::RouterKind::softmax_topk;
  o.norm_topk_prob = true;
  return o;
}

}  // namespace train_moe_model_local

StepStats train_step(Model& m, const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets, int64_t B, int64_t S) {
  using namespace train_moe_model_local;
  const ModelConfig& c = m.cfg;
  const int64_t T = B * S, D = c.dim, V = c.vocab, W = c.window;
  for (Param* p : m.params()) p->zero_grad();
  StepStats st;
  Tensor x = f32({T, D});
  for (int64_t t = 0; t < T; ++t) std::memcpy(x.ptr<float>() + t * D, m.emb.w.ptr<float>() + inputs[size_t(t)] * D, size_t(D) * 4);
  const moe::MoeFfnOptions mo = moe_options(c);
  std::vector<BlockCache> cache(m.blocks.size());
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    auto& b = m.blocks[l];
    auto& k = cache[l];
    k.x_in = Tensor::copy_of(x);
    k.u = f32({T, D});
    k.r1 = f32({T});
    rmsnorm(x.ptr<float>(), b.n1.w.ptr<float>(), k.u.ptr<float>(), k.r1.ptr<float>(), T, D);
    k.c = f32({T, D});  // causal depthwise conv inside each sequence
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < W && j <= t % S; ++j)
        for (int64_t d = 0; d < D; ++d) k.c.ptr<float>()[t * D + d] += b.conv.w.ptr<float>()[j * D + d] * k.u.ptr<float>()[(t - j) * D + d];
    gemm::matmul(MatView::of(k.c), MatView::of(b.mix.w), MutMatView::of(x), 1.f, 1.f);  // x += c W_mix
    k.x_mid = Tensor::copy_of(x);
    k.v = f32({T, D});
    k.r2 = f32({T});
    rmsnorm(x.ptr<float>(), b.n2.w.ptr<float>(), k.v.ptr<float>(), k.r2.ptr<float>(), T, D);
    k.v_c = to_dtype(k.v, c.dtype);
    k.router_c = to_dtype(b.router.w, c.dtype);
    k.gate_c = to_dtype(b.gate.w, c.dtype);
    k.up_c = to_dtype(b.up.w, c.dtype);
    k.down_c = to_dtype(b.down.w, c.dtype);
    moe::MoeFfnWeights mw{k.router_c, k.gate_c, k.up_c, k.down_c, {}, {}, {}};
    auto fr = moe::moe_ffn_forward_train(k.v_c, mw, mo);
    k.saved = std::move(fr.saved);
    st.dropped += k.saved.dropped;
    Tensor y = to_dtype(fr.y, DType::f32);
    for (int64_t i = 0; i < T * D; ++i) x.ptr<float>()[i] += y.ptr<float>()[i];
  }
  // Head and loss.
  Tensor xf = f32({T, D}), rf = f32({T}), logits = f32({T, V});
  rmsnorm(x.ptr<float>(), m.nf.w.ptr<float>(), xf.ptr<float>(), rf.ptr<float>(), T, D);
  gemm::matmul(MatView::of(xf), MatView::of(m.head.w), MutMatView::of(logits));
  Tensor dlogits = f32({T, V});
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits.ptr<float>() + t * V;
    float* dz = dlogits.ptr<float>() + t * V;
    double mx = z[0], s = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(z[v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx);
    loss += std::log(s) + mx - z[targets[size_t(t)]];
    for (int64_t v = 0; v < V; ++v) dz[v] = float(std::exp(z[v] - mx) / s / double(T));
    dz[targets[size_t(t)]] -= 1.f / float(T);
  }
  st.loss = loss / double(T);
  // Backward.
  gemm::matmul(MatView::of(xf).t(), MatView::of(dlogits), MutMatView::of(m.head.g));
  Tensor dxf = f32({T, D}), dx = f32({T, D});
  gemm::matmul(MatView::of(dlogits), MatView::of(m.head.w).t(), MutMatView::of(dxf));
  rmsnorm_backward(x.ptr<float>(), m.nf.w.ptr<float>(), rf.ptr<float>(), dxf.ptr<float>(), dx.ptr<float>(), m.nf.g.ptr<float>(), T, D);
  moe::MoeFfnBackwardOptions bo;
  bo.aux_loss_coeff = c.aux_coeff;
  for (size_t l = m.blocks.size(); l-- > 0;) {
    auto& b = m.blocks[l];
    auto& k = cache[l];
    moe::MoeFfnWeights mw{k.router_c, k.gate_c, k.up_c, k.down_c, {}, {}, {}};
    Tensor dy_c = to_dtype(dx, c.dtype);
    auto g = moe::moe_ffn_backward(dy_c, k.v_c, mw, k.saved, mo, bo);
    st.aux += g.aux_loss;
    copy_into(g.d_router, b.router.g);
    copy_into(g.d_gate, b.gate.g);
    copy_into(g.d_up, b.up.g);
    copy_into(g.d_down, b.down.g);
    Tensor dv = to_dtype(g.dx, DType::f32);
    rmsnorm_backward(k.x_mid.ptr<float>(), b.n2.w.ptr<float>(), k.r2.ptr<float>(), dv.ptr<float>(), dx.ptr<float>(), b.n2.g.ptr<float>(), T, D);
    // x_mid = x_in + c W_mix: dW_mix = c^T dx, dc = dx W_mix^T.
    gemm::matmul(MatView::of(k.c).t(), MatView::of(dx), MutMatView::of(b.mix.g));
    Tensor dc = f32({T, D}), du = f32({T, D});
    gemm::matmul(MatView::of(dx), MatView::of(b.mix.w).t(), MutMatView::of(dc));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < W && j <= t % S; ++j)
        for (int64_t d = 0; d < D; ++d) {
          b.conv.g.ptr<float>()[j * D + d] += dc.ptr<float>()[t * D + d] * k.u.ptr<float>()[(t - j) * D + d];
          du.ptr<float>()[(t - j) * D + d] += b.conv.w.ptr<float>()[j * D + d] * dc.ptr<float>()[t * D + d];
        }
    rmsnorm_backward(k.x_in.ptr<float>(), b.n1.w.ptr<float>(), k.r1.ptr<float>(), du.ptr<float>(), dx.ptr<float>(), b.n1.g.ptr<float>(), T, D);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) m.emb.g.ptr<float>()[inputs[size_t(t)] * D + d] += dx.ptr<float>()[t * D + d];
  return st;
}

void adamw(Model& m, float lr, int step, float b1, float b2, float wd, float eps) {
  const double c1 = 1 - std::pow(double(b1), step), c2 = 1 - std::pow(double(b2), step);
  for (Param* p : m.params()) {
    float *w = p->w.ptr<float>(), *g = p->g.ptr<float>(), *mm = p->m.ptr<float>(), *vv = p->v.ptr<float>();
    const float decay = p->decay ? lr * wd : 0.f;
    for (int64_t i = 0; i < p->w.numel(); ++i) {
      mm[i] = b1 * mm[i] + (1 - b1) * g[i];
      vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
      w[i] -= decay * w[i] + lr * float((mm[i] / c1) / (std::sqrt(vv[i] / c2) + eps));
    }
  }
}

}  // namespace ot::cli::train
