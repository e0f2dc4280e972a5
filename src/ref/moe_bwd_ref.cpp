// Plain references of the MoE backward operators: loops a reader can check by eye, fp64
// accumulation, element access through the views' strides.
#include "src/ref/moe_bwd_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ot/moe/router.h"
#include "src/ref/act_math.h"
#include "src/ref/group_list.h"
#include "src/ref/moe_ffn_ref.h"
#include "src/ref/moe_loss_ref.h"

namespace ot::moe::refimpl {

static double at2(const TensorView& v, int64_t i, int64_t j) { return get_as_double(v, i * v.sizes[1] + j); }
static double at3(const TensorView& v, int64_t g, int64_t i, int64_t j) {
  return get_as_double(v, (g * v.sizes[1] + i) * v.sizes[2] + j);
}

// One row of dz = act'(z) * dy in fp64.
static void act_grad_row(gemm::Act act, const double* z, const double* dy, int64_t n_out, double* dz) {
  if (act == gemm::Act::swiglu) {
    for (int64_t n = 0; n < n_out; ++n) refmath::swiglu_grad(z[n], z[n + n_out], dy[n], &dz[n], &dz[n + n_out]);
  } else {
    for (int64_t n = 0; n < n_out; ++n) dz[n] = refmath::act_grad(act, z[n], dy[n]);
  }
}

void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz) {
  int64_t M = z.sizes[0], N = z.sizes[1], n_out = dy.sizes[1];
  std::vector<double> zr(static_cast<size_t>(N)), dyr(static_cast<size_t>(n_out)), dzr(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) zr[size_t(n)] = at2(z, m, n);
    for (int64_t n = 0; n < n_out; ++n) dyr[size_t(n)] = at2(dy, m, n);
    act_grad_row(act, zr.data(), dyr.data(), n_out, dzr.data());
    for (int64_t n = 0; n < N; ++n) set_from_double(dz, m * N + n, dzr[size_t(n)]);
  }
}

GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                                           const TensorView& group_list, const GroupedMatmulBackwardOptions& opt) {
  const int64_t M = x.size(0), K = x.size(1), G = w.size(0), N = w.size(2);
  const int64_t n_out = opt.act == gemm::Act::swiglu ? N / 2 : N;  // swiglu: columns [gate | up]
  const std::vector<int64_t> group = refgroups::group_of_rows(group_list, opt.group_list_type, M);
  GroupedMatmulGrads r;
  if (opt.need_dx) r.dx = Tensor::zeros(x.dtype, {M, K});
  TensorView dw = opt.dweight_out, db = opt.dbias_out;
  if (opt.need_dweight && !dw.defined()) { r.dweight = Tensor::zeros(DType::f32, {G, K, N}); dw = r.dweight; }
  if (opt.need_dbias && !db.defined()) { r.dbias = Tensor::zeros(DType::f32, {G, N}); db = r.dbias; }
  const bool acc_w = opt.accumulate && opt.dweight_out.defined(), acc_b = opt.accumulate && opt.dbias_out.defined();

  std::vector<double> zr(static_cast<size_t>(N)), dyr(static_cast<size_t>(n_out)), dz(static_cast<size_t>(N)), gw(static_cast<size_t>(K * N)), gb(static_cast<size_t>(N));
  for (int64_t g = 0; g < G; ++g) {
    std::fill(gw.begin(), gw.end(), 0.0);
    std::fill(gb.begin(), gb.end(), 0.0);
    for (int64_t m = 0; m < M; ++m) {
      if (group[size_t(m)] != g) continue;
      {
        for (int64_t n = 0; n < N; ++n) {
          if (opt.pre_act.defined()) { zr[size_t(n)] = at2(opt.pre_act, m, n); continue; }
          double acc = opt.bias.defined() ? at2(opt.bias, g, n) : 0.0;
          for (int64_t k = 0; k < K; ++k) acc += at2(x, m, k) * at3(w, g, k, n);
          zr[size_t(n)] = acc;
        }
        for (int64_t n = 0; n < n_out; ++n) dyr[size_t(n)] = at2(dy, m, n);
        act_grad_row(opt.act, zr.data(), dyr.data(), n_out, dz.data());
        if (opt.need_dx) {
          for (int64_t k = 0; k < K; ++k) {
            double acc = 0;
            for (int64_t n = 0; n < N; ++n) acc += dz[size_t(n)] * at3(w, g, k, n);
            set_from_double(r.dx, m * K + k, acc);
          }
        }
        for (int64_t k = 0; k < K; ++k) {
          double xv = at2(x, m, k);
          for (int64_t n = 0; n < N; ++n) gw[size_t(k * N + n)] += xv * dz[size_t(n)];
        }
        for (int64_t n = 0; n < N; ++n) gb[size_t(n)] += dz[size_t(n)];
      }
    }
    if (opt.need_dweight)
      for (int64_t i = 0; i < K * N; ++i) {
        int64_t flat = g * K * N + i;
        set_from_double(dw, flat, gw[size_t(i)] + (acc_w ? get_as_double(dw, flat) : 0.0));
      }
    if (opt.need_dbias)
      for (int64_t n = 0; n < N; ++n) set_from_double(db, g * N + n, gb[size_t(n)] + (acc_b ? get_as_double(db, g * N + n) : 0.0));
  }
  return r;
}

// ---- routing: each backward is the forward's loop with the assignment turned around ----------
static void add_row(const TensorView& dst, int64_t drow, const TensorView& src, int64_t srow, int64_t H, double scale) {
  for (int64_t h = 0; h < H; ++h)
    set_from_double(dst, drow * H + h, get_as_double(dst, drow * H + h) + scale * get_as_double(src, srow * H + h));
}
static double dot_rows(const TensorView& a, int64_t ra, const TensorView& b, int64_t rb, int64_t H) {
  double s = 0;
  for (int64_t h = 0; h < H; ++h) s += get_as_double(a, ra * H + h) * get_as_double(b, rb * H + h);
  return s;
}

Tensor moe_token_permute_backward(const TensorView& dp, const TensorView& si, int64_t topk) {
  struct { int64_t T, K, P, H; } p{si.numel() / topk, topk, dp.size(0), dp.size(1)};
  std::vector<double> acc(static_cast<size_t>(p.T * p.H), 0.0);
  for (int64_t j = 0; j < p.T * p.K; ++j) {  // forward: permuted[si[j]] = tokens[j / K]
    int64_t d = si.ptr<int32_t>()[j];
    if (d < 0 || d >= p.P) continue;
    for (int64_t h = 0; h < p.H; ++h) acc[size_t(j / p.K * p.H + h)] += get_as_double(dp, d * p.H + h);
  }
  Tensor out = Tensor::empty(dp.dtype, {p.T, p.H});
  for (size_t i = 0; i < acc.size(); ++i) set_from_double(out, int64_t(i), acc[i]);
  return out;
}

TokenUnpermuteGrads moe_token_unpermute_backward(const TensorView& dout, const TensorView& permuted, const TensorView& si,
                                                 const TensorView& probs) {
  struct { int64_t T, K, P, H; } p{dout.size(0), probs.defined() ? probs.size(1) : 1, permuted.size(0), dout.size(1)};
  TokenUnpermuteGrads g;
  g.d_permuted = Tensor::zeros(permuted.dtype, {p.P, p.H});
  if (probs.defined()) g.d_probs = Tensor::zeros(DType::f32, {p.T, p.K});
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t k = 0; k < p.K; ++k) {  // forward: out[t] += probs[t,k] * permuted[d]
      int64_t d = si.ptr<int32_t>()[t * p.K + k];
      if (d < 0 || d >= p.P) continue;
      double pr = probs.defined() ? get_as_double(probs, t * p.K + k) : 1.0;
      add_row(g.d_permuted, d, dout, t, p.H, pr);
      if (probs.defined()) g.d_probs.ptr<float>()[t * p.K + k] = float(dot_rows(dout, t, permuted, d, p.H));
    }
  return g;
}

// Rows of an expanded tensor: [P, H], or [E, C, H] in drop/pad mode.
static int64_t expanded_rows(const TensorView& v) { return v.ndim == 2 ? v.size(0) : v.size(0) * v.size(1); }

static Tensor expanded_to_tokens(const TensorView& dex, int64_t N, int64_t K, int64_t H, int64_t P, const std::vector<int64_t>& dst_of_j) {
  std::vector<double> acc(static_cast<size_t>(N * H), 0.0);
  for (int64_t j = 0; j < N * K; ++j) {  // forward: expanded[dst_of_j[j]] = x[j / K]
    int64_t d = dst_of_j[size_t(j)];
    if (d < 0 || d >= P) continue;
    for (int64_t h = 0; h < H; ++h) acc[size_t(j / K * H + h)] += get_as_double(dex, d * H + h);
  }
  Tensor out = Tensor::empty(dex.dtype, {N, H});
  for (size_t i = 0; i < acc.size(); ++i) set_from_double(out, int64_t(i), acc[i]);
  return out;
}

Tensor moe_init_routing_v2_backward(const TensorView& dex, const TensorView& idx, int64_t N, int64_t K, int type) {
  struct { int64_t H, P; } p{dex.size(-1), expanded_rows(dex)};
  std::vector<int64_t> dst(static_cast<size_t>(N * K), -1);
  const int32_t* s = idx.ptr<int32_t>();
  if (type == 0) for (int64_t j = 0; j < N * K; ++j) dst[size_t(j)] = s[j];
  else for (int64_t i = 0; i < p.P; ++i) dst[size_t(s[i])] = i;
  return expanded_to_tokens(dex, N, K, p.H, p.P, dst);
}

Tensor moe_init_routing_backward(const TensorView& dex, const TensorView& idx, int64_t N, int64_t K) {
  struct { int64_t H, P; } p{dex.size(-1), expanded_rows(dex)};
  std::vector<int64_t> dst(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) dst[size_t(n * K + k)] = idx.ptr<int32_t>()[k * N + n];  // k-major
  return expanded_to_tokens(dex, N, K, p.H, p.P, dst);
}

FinalizeRoutingGrads moe_finalize_routing_v2_backward(const TensorView& dout, const TensorView& ex, const TensorView& idx, const TensorView& scales,
                                                      const TensorView& bias, const TensorView& expert_idx, int mode) {
  const int64_t N = dout.size(0), K = scales.defined() ? scales.size(1) : 1, H = dout.size(1);
  struct { int64_t P, E; } p{expanded_rows(ex), bias.defined() ? bias.size(0) : 0};
  FinalizeRoutingGrads g;
  g.d_expanded_x = Tensor::zeros(ex.dtype, ex.shape());
  TensorView R = ex.reshape({p.P, H}), dR = g.d_expanded_x.view().reshape({p.P, H});
  if (scales.defined()) g.d_scales = Tensor::zeros(DType::f32, {N, K});
  if (bias.defined()) g.d_bias = Tensor::zeros(DType::f32, {p.E, H});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {  // forward: out[n] += s * (R[d] + bias[e])
      int64_t d = idx.ptr<int32_t>()[mode <= 1 ? k * N + n : n * K + k];
      double s = scales.defined() ? get_as_double(scales, n * K + k) : 1.0;
      int64_t e = bias.defined() ? expert_idx.ptr<int32_t>()[n * K + k] : -1;
      if (d >= 0) add_row(dR, d, dout, n, H, s);
      if (e >= 0) add_row(g.d_bias, e, dout, n, H, s);
      if (scales.defined())
        g.d_scales.ptr<float>()[n * K + k] = float((d >= 0 ? dot_rows(dout, n, R, d, H) : 0.0) + (e >= 0 ? dot_rows(dout, n, bias, e, H) : 0.0));
    }
  return g;
}

// ---- routers: explicit Jacobians, d_x[j] = sum_k dy[k] * d y[k] / d x[j] ----------------------
static std::vector<double> softmax_ref(const TensorView& x, int64_t t, int64_t E, const TensorView& allowed) {
  std::vector<double> p(static_cast<size_t>(E), 0.0);
  double m = -std::numeric_limits<double>::infinity(), s = 0;
  auto ok = [&](int64_t e) { return !allowed.defined() || allowed.ptr<uint8_t>()[t * E + e]; };
  for (int64_t e = 0; e < E; ++e) if (ok(e)) m = std::max(m, get_as_double(x, t * E + e));
  for (int64_t e = 0; e < E; ++e) if (ok(e)) s += std::exp(get_as_double(x, t * E + e) - m);
  for (int64_t e = 0; e < E; ++e) p[size_t(e)] = ok(e) ? std::exp(get_as_double(x, t * E + e) - m) / s : 0.0;
  return p;
}

Tensor moe_gating_top_k_softmax_backward(const TensorView& dy, const TensorView& x, const TensorView& ids, const TensorView& allowed) {
  return moe_gating_top_k_softmax_v2_backward(dy, x, ids, 0, allowed);
}

Tensor moe_gating_top_k_softmax_v2_backward(const TensorView& dy, const TensorView& x, const TensorView& ids, int renorm, const TensorView& allowed) {
  struct { int64_t T; } p{x.size(0)};
  const int64_t E = x.size(1), K = dy.size(1);
  Tensor dx = Tensor::zeros(DType::f32, {p.T, E});
  for (int64_t t = 0; t < p.T; ++t) {
    const int32_t* id = ids.ptr<int32_t>() + t * K;
    if (id[0] == E) continue;  // finished
    if (renorm == 0) {
      auto pr = softmax_ref(x, t, E, allowed);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < E; ++j)  // d p_i / d x_j = p_i (delta_ij - p_j)
          dx.ptr<float>()[t * E + j] += float(get_as_double(dy, t * K + k) * pr[size_t(id[k])] * ((id[k] == j) - pr[size_t(j)]));
    } else {
      std::vector<double> y(static_cast<size_t>(K));
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += (y[size_t(k)] = std::exp(get_as_double(x, t * E + id[k])));
      for (auto& v : y) v /= s;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < K; ++j)
          dx.ptr<float>()[t * E + id[j]] += float(get_as_double(dy, t * K + k) * y[size_t(k)] * ((k == j) - y[size_t(j)]));
    }
  }
  return dx;
}

Tensor moe_gating_top_k_backward(const TensorView& dy, const TensorView& sc, const TensorView& ids, int renorm, int norm_type, float rsf,
                                 float eps) {
  struct { int64_t T; } p{sc.size(0)};
  const int64_t E = sc.size(1), K = dy.size(1);
  Tensor dx = Tensor::zeros(DType::f32, {p.T, E});
  for (int64_t t = 0; t < p.T; ++t) {
    const int32_t* id = ids.ptr<int32_t>() + t * K;
    if (id[0] == E) continue;
    double S = 0;
    for (int64_t k = 0; k < K; ++k) S += get_as_double(sc, t * E + id[k]);
    std::vector<double> ds(static_cast<size_t>(E), 0.0);  // gradient of the scores s
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < K; ++j) {  // y_k = rsf * s_k / (S + eps)  or  rsf * s_k
        double sk = get_as_double(sc, t * E + id[k]);
        double dyk_dsj = (norm_type == 1 || renorm == 1) ? rsf * ((k == j) / (S + eps) - sk / ((S + eps) * (S + eps))) : rsf * (k == j);
        ds[size_t(id[j])] += get_as_double(dy, t * K + k) * dyk_dsj;
      }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < E; ++j) {  // s = softmax(x): ds_e/dx_j = s_e (delta - s_j); sigmoid: delta s (1 - s)
        double se = get_as_double(sc, t * E + e), sj = get_as_double(sc, t * E + j);
        double jac = norm_type == 0 ? se * ((e == j) - sj) : (e == j) * se * (1 - se);
        dx.ptr<float>()[t * E + j] += float(ds[size_t(e)] * jac);
      }
  }
  return dx;
}

Tensor topk_renorm_backward(const TensorView& dw, const TensorView& y) {
  const int64_t T = y.size(0), K = y.size(1);
  Tensor d = Tensor::zeros(DType::f32, {T, K});
  for (int64_t t = 0; t < T; ++t) {
    double S = 0;
    for (int64_t k = 0; k < K; ++k) S += get_as_double(y, t * K + k);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < K; ++j)  // w_k = y_k / S: dw_k/dy_j = delta/S - y_k/S^2
        d.ptr<float>()[t * K + j] += float(get_as_double(dw, t * K + k) * ((k == j) / S - get_as_double(y, t * K + k) / (S * S)));
  }
  return d;
}

// ---- losses ----
Tensor moe_aux_loss_backward(const TensorView& probs, const TensorView& tpe, int64_t k, float coeff, float d_loss) {
  const int64_t T = probs.size(0), E = probs.size(1);
  std::vector<double> counts(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) counts[size_t(i)] = get_as_double(tpe, i);
  Tensor d = Tensor::zeros(DType::f32, {T, E});
  for (int64_t t = 0; t < T; ++t)  // loss = coeff * E * sum_i (counts_i / (T K)) * (sum_t probs[t,i] / T)
    for (int64_t i = 0; i < E; ++i) d.ptr<float>()[t * E + i] = float(double(d_loss) * coeff * double(E) * counts[size_t(i)] / (double(T) * double(k)) / double(T));
  return d;
}

Tensor moe_z_loss_backward(const TensorView& logits, float coeff, const TensorView& mask, float d_loss) {
  const int64_t T = logits.size(0), E = logits.size(1);
  int64_t n = 0;
  for (int64_t t = 0; t < T; ++t) n += !mask.defined() || mask.ptr<uint8_t>()[t];
  Tensor d = Tensor::zeros(DType::f32, {T, E});
  for (int64_t t = 0; t < T; ++t) {
    if (mask.defined() && !mask.ptr<uint8_t>()[t]) continue;
    auto p = softmax_ref(logits, t, E, {});
    double s = 0;  // lse = log sum exp; d lse^2 / dx_e = 2 lse softmax_e
    for (int64_t e = 0; e < E; ++e) s += std::exp(get_as_double(logits, t * E + e));
    double lse = std::log(s);
    for (int64_t e = 0; e < E; ++e) d.ptr<float>()[t * E + e] = float(double(d_loss) * coeff * 2 * lse * p[size_t(e)] / double(std::max<int64_t>(n, 1)));
  }
  return d;
}


static Tensor from_doubles(const std::vector<int64_t>& shape, const std::vector<double>& v) {
  Tensor t = Tensor::empty(DType::f32, shape);
  for (size_t i = 0; i < v.size(); ++i) t.ptr<float>()[i] = float(v[i]);
  return t;
}

// ---- moe_ffn_backward: per token, every projection differentiated in fp64 ----------------------
MoeFfnGrads moe_ffn_backward(const TensorView& dy, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o,
                             const MoeFfnBackwardOptions& bo) {
  const int64_t T = x.size(0), E = w.gate.size(0), H = w.gate.size(1), I = w.gate.size(2), K = o.k;
  const int64_t Is = w.shared_gate.defined() ? w.shared_gate.size(1) : 0;
  // fp64 copies (contiguous) so the loops below index plain arrays.
  auto doubles = [](const TensorView& v) {
    std::vector<double> r(static_cast<size_t>(v.numel()));
    for (int64_t i = 0; i < v.numel(); ++i) r[size_t(i)] = get_as_double(v, i);
    return r;
  };
  const std::vector<double> xd = doubles(x), dyd = doubles(dy), rd = doubles(w.router);
  auto X = [&](int64_t t, int64_t h) { return xd[size_t(t * H + h)]; };
  // Router logits and selection (the forward's reference router).
  Tensor logits = Tensor::empty(DType::f32, {T, E});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += X(t, h) * rd[size_t(e * H + h)];
      logits.ptr<float>()[t * E + e] = float(s);
    }
  GatingResult gr;
  switch (o.router) {
    case RouterKind::softmax_topk: gr = ref::moe_gating_top_k_softmax(logits, K, {}, o.allowed); break;
    case RouterKind::softmax_topk_v2: gr = ref::moe_gating_top_k_softmax_v2(logits, K, {}, o.renorm, false, o.allowed); break;
    case RouterKind::gating_top_k: {
      GatingTopKOptions go = o.gating;
      go.k = K;
      go.allowed = o.allowed;
      go.out_flag = true;
      gr = ref::moe_gating_top_k(logits, go);
      break;
    }
  }
  const bool renorm = o.norm_topk_prob && o.router != RouterKind::gating_top_k;
  std::vector<double> wts(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {
    double S = 0;
    for (int64_t k = 0; k < K; ++k) S += get_as_double(gr.y, t * K + k);
    for (int64_t k = 0; k < K; ++k) wts[size_t(t * K + k)] = get_as_double(gr.y, t * K + k) / (renorm ? S : 1.0);
  }
  // Capacity: within an expert, earlier tokens keep their place.
  int64_t cap = ffn_capacity(o, T, E);
  std::vector<int64_t> seen(static_cast<size_t>(E), 0), counts(static_cast<size_t>(E), 0);
  std::vector<char> kept(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      int32_t e = gr.expert_idx.ptr<int32_t>()[t * K + k];
      counts[size_t(e)]++;
      kept[size_t(t * K + k)] = cap < 0 || seen[size_t(e)]++ < cap;
    }

  MoeFfnGrads g;
  g.d_gate = Tensor::zeros(DType::f32, {E, H, I});
  g.d_up = Tensor::zeros(DType::f32, {E, H, I});
  g.d_down = Tensor::zeros(DType::f32, {E, I, H});
  std::vector<double> dx(static_cast<size_t>(T * H), 0.0), dwts(static_cast<size_t>(T * K), 0.0);
  std::vector<double> zg(size_t(std::max(I, Is))), zu(zg.size()), a(zg.size()), gv(zg.size()), dzg(zg.size()), dzu(zg.size());
  // One SwiGLU expert on token t: adds its weight, input gradients; returns dy . output.
  auto expert = [&](int64_t t, const std::vector<double>& Wg, const std::vector<double>& Wu, const std::vector<double>& Wd, int64_t n, double wt,
                    float* dWg, float* dWu, float* dWd) {
    for (int64_t i = 0; i < n; ++i) {
      zg[size_t(i)] = zu[size_t(i)] = 0;
      for (int64_t h = 0; h < H; ++h) { zg[size_t(i)] += X(t, h) * Wg[size_t(h * n + i)]; zu[size_t(i)] += X(t, h) * Wu[size_t(h * n + i)]; }
      a[size_t(i)] = zg[size_t(i)] * refmath::sigmoid(zg[size_t(i)]) * zu[size_t(i)];
      gv[size_t(i)] = 0;
      for (int64_t h = 0; h < H; ++h) gv[size_t(i)] += Wd[size_t(i * H + h)] * dyd[size_t(t * H + h)];
    }
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) {
      dot += gv[size_t(i)] * a[size_t(i)];
      refmath::swiglu_grad(zg[size_t(i)], zu[size_t(i)], wt * gv[size_t(i)], &dzg[size_t(i)], &dzu[size_t(i)]);
      for (int64_t h = 0; h < H; ++h) {
        dWd[i * H + h] += float(wt * a[size_t(i)] * dyd[size_t(t * H + h)]);
        dWg[h * n + i] += float(X(t, h) * dzg[size_t(i)]);
        dWu[h * n + i] += float(X(t, h) * dzu[size_t(i)]);
        dx[size_t(t * H + h)] += Wg[size_t(h * n + i)] * dzg[size_t(i)] + Wu[size_t(h * n + i)] * dzu[size_t(i)];
      }
    }
    return dot;
  };
  for (int64_t e = 0; e < E; ++e) {  // expert by expert, its weights in fp64 once
    std::vector<int64_t> pairs;
    for (int64_t j = 0; j < T * K; ++j)
      if (kept[size_t(j)] && gr.expert_idx.ptr<int32_t>()[j] == e) pairs.push_back(j);
    if (pairs.empty()) continue;
    const auto Wg = doubles(w.gate.select(0, e)), Wu = doubles(w.up.select(0, e)), Wd = doubles(w.down.select(0, e));
    for (int64_t j : pairs)
      dwts[size_t(j)] = expert(j / K, Wg, Wu, Wd, I, wts[size_t(j)], g.d_gate.ptr<float>() + e * H * I, g.d_up.ptr<float>() + e * H * I,
                               g.d_down.ptr<float>() + e * I * H);
  }
  if (Is > 0) {
    g.d_shared_gate = Tensor::zeros(DType::f32, {H, Is});
    g.d_shared_up = Tensor::zeros(DType::f32, {H, Is});
    g.d_shared_down = Tensor::zeros(DType::f32, {Is, H});
    const auto sgd = doubles(w.shared_gate), sud = doubles(w.shared_up), sdd = doubles(w.shared_down);
    for (int64_t t = 0; t < T; ++t)
      expert(t, sgd, sud, sdd, Is, 1.0, g.d_shared_gate.ptr<float>(), g.d_shared_up.ptr<float>(), g.d_shared_down.ptr<float>());
  }
  // Router: weights -> (renorm) -> router backward; losses on the logits.
  Tensor dw = from_doubles({T, K}, dwts);
  Tensor dyr = renorm ? topk_renorm_backward(dw, gr.y) : dw;
  Tensor dl;
  switch (o.router) {
    case RouterKind::softmax_topk: dl = moe_gating_top_k_softmax_backward(dyr, logits, gr.expert_idx, o.allowed); break;
    case RouterKind::softmax_topk_v2: dl = moe_gating_top_k_softmax_v2_backward(dyr, logits, gr.expert_idx, o.renorm, o.allowed); break;
    case RouterKind::gating_top_k:
      dl = moe_gating_top_k_backward(dyr, gr.scores, gr.expert_idx, o.gating.renorm, o.gating.norm_type, o.gating.routed_scaling_factor, o.gating.eps);
      break;
  }
  std::vector<double> dlog(static_cast<size_t>(T * E));
  for (int64_t i = 0; i < T * E; ++i) dlog[size_t(i)] = dl.ptr<float>()[i];
  Tensor cnt = Tensor::empty(DType::i64, {E});
  for (int64_t e = 0; e < E; ++e) cnt.ptr<int64_t>()[e] = counts[size_t(e)];
  if (bo.aux_loss_coeff > 0) {  // probs = softmax (or s / sum s for sigmoid): chain through the full Jacobian
    const bool sig = o.router == RouterKind::gating_top_k && o.gating.norm_type == 1;
    std::vector<double> P(static_cast<size_t>(T * E)), base(static_cast<size_t>(T * E));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> p = sig ? std::vector<double>(size_t(E)) : softmax_ref(logits, t, E, o.allowed);
      double S = 0;
      for (int64_t e = 0; e < E; ++e) S += base[size_t(t * E + e)] = sig ? 1 / (1 + std::exp(-double(logits.ptr<float>()[t * E + e]))) : p[size_t(e)];
      for (int64_t e = 0; e < E; ++e) P[size_t(t * E + e)] = base[size_t(t * E + e)] / S;
    }
    Tensor probs = from_doubles({T, E}, P);
    g.aux_loss = aux_loss(probs, cnt, K, bo.aux_loss_coeff);
    Tensor dp = moe_aux_loss_backward(probs, cnt, K, bo.aux_loss_coeff, 1.f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e)
        for (int64_t j = 0; j < E; ++j) {  // d P_e / d x_j
          double Pe = P[size_t(t * E + e)], Pj = P[size_t(t * E + j)], sj = base[size_t(t * E + j)];
          double jac = sig ? ((e == j) - Pe) * Pj * (1 - sj) : Pe * ((e == j) - Pj);
          dlog[size_t(t * E + j)] += dp.ptr<float>()[t * E + e] * jac;
        }
  }
  if (bo.z_loss_coeff > 0) {
    g.z_loss = z_loss(logits, bo.z_loss_coeff, {});
    Tensor dz = moe_z_loss_backward(logits, bo.z_loss_coeff, {}, 1.f);
    for (int64_t i = 0; i < T * E; ++i) dlog[size_t(i)] += dz.ptr<float>()[i];
  }
  g.d_router = Tensor::zeros(DType::f32, {E, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) {
        g.d_router.ptr<float>()[e * H + h] += float(dlog[size_t(t * E + e)] * X(t, h));
        dx[size_t(t * H + h)] += dlog[size_t(t * E + e)] * rd[size_t(e * H + h)];
      }
  g.dx = Tensor::empty(x.dtype, {T, H});
  for (int64_t i = 0; i < T * H; ++i) set_from_double(g.dx, i, dx[size_t(i)]);
  return g;
}

}  // namespace ot::moe::refimpl
