// Plain fp64 causal depthwise conv1d: per sequence and channel, the W-1 state inputs followed by the
// tokens form one stream s[p] (p = 0 .. W-2 the state, p = W-1 + t token t); y[t] = act(bias +
// sum_k w[k] s[t + k]).
#include <vector>

#include "src/ref/gdn_layer_ref.h"
#include "src/ref/layer_elem.h"

namespace ot::gdn::ref {
namespace {

struct Seq {
  int64_t row, bos, len, n;
};
std::vector<Seq> sequences(const TensorView& x, const std::vector<int64_t>& starts) {
  std::vector<Seq> s;
  if (starts.empty())
    for (int64_t b = 0; b < x.sizes[0]; ++b) s.push_back({b, 0, x.sizes[1], b});
  else
    for (size_t n = 0; n + 1 < starts.size(); ++n) s.push_back({0, starts[n], starts[n + 1] - starts[n], int64_t(n)});
  return s;
}
// The stream of sequence q, channel d: state then tokens.
std::vector<double> stream(const TensorView& x, const TensorView& init, const Seq& q, int64_t d, int64_t W) {
  std::vector<double> s(size_t(W - 1 + q.len), 0.0);
  if (init.defined())
    for (int64_t j = 0; j < W - 1; ++j) s[size_t(j)] = rd(init, {q.n, d, j});
  for (int64_t t = 0; t < q.len; ++t) s[size_t(W - 1 + t)] = rd(x, {q.row, q.bos + t, d});
  return s;
}
double pre_act(const std::vector<double>& s, const TensorView& w, const TensorView& bias, int64_t d, int64_t W, int64_t t) {
  double acc = bias.defined() ? rd(bias, {d}) : 0.0;
  for (int64_t k = 0; k < W; ++k) acc += rd(w, {d, k}) * s[size_t(t + k)];
  return acc;
}

}  // namespace

void causal_conv1d_fwd(const TensorView& x, const TensorView& weight, const TensorView& bias, const TensorView& init, bool silu,
                       const std::vector<int64_t>& seq_starts, const TensorView& y, const TensorView& fin) {
  const int64_t D = x.sizes[2], W = weight.sizes[1];
  for (const Seq& q : sequences(x, seq_starts))
    for (int64_t d = 0; d < D; ++d) {
      std::vector<double> s = stream(x, init, q, d, W);
      for (int64_t t = 0; t < q.len; ++t) {
        double a = pre_act(s, weight, bias, d, W, t);
        wr(y, {q.row, q.bos + t, d}, silu ? a * sigmoid(a) : a);
      }
      if (fin.defined())
        for (int64_t j = 0; j < W - 1; ++j) wr(fin, {q.n, d, j}, s[size_t(q.len + j)]);
    }
}

void causal_conv1d_bwd(const TensorView& x, const TensorView& weight, const TensorView& bias, const TensorView& init, bool silu,
                       const std::vector<int64_t>& seq_starts, const TensorView& dy, const TensorView& dfin, const TensorView& dx,
                       const TensorView& dweight, const TensorView& dbias, const TensorView& dinit) {
  const int64_t D = x.sizes[2], W = weight.sizes[1];
  std::vector<double> dw(size_t(D * W), 0.0), db(size_t(D), 0.0);
  for (const Seq& q : sequences(x, seq_starts))
    for (int64_t d = 0; d < D; ++d) {
      std::vector<double> s = stream(x, init, q, d, W), ds(s.size(), 0.0);
      for (int64_t t = 0; t < q.len; ++t) {
        double a = pre_act(s, weight, bias, d, W, t), g = rd(dy, {q.row, q.bos + t, d});
        if (silu) {
          double sg = sigmoid(a);
          g *= sg * (1 + a * (1 - sg));
        }
        db[size_t(d)] += g;
        for (int64_t k = 0; k < W; ++k) {
          dw[size_t(d * W + k)] += g * s[size_t(t + k)];
          ds[size_t(t + k)] += g * rd(weight, {d, k});
        }
      }
      if (dfin.defined())
        for (int64_t j = 0; j < W - 1; ++j) ds[size_t(q.len + j)] += rd(dfin, {q.n, d, j});
      for (int64_t t = 0; t < q.len; ++t) wr(dx, {q.row, q.bos + t, d}, ds[size_t(W - 1 + t)]);
      if (dinit.defined())
        for (int64_t j = 0; j < W - 1; ++j) wr(dinit, {q.n, d, j}, ds[size_t(j)]);
    }
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t k = 0; k < W; ++k) wr(dweight, {d, k}, dw[size_t(d * W + k)]);
    if (dbias.defined()) wr(dbias, {d}, db[size_t(d)]);
  }
}

void causal_conv1d_update(const TensorView& x, const TensorView& state, const TensorView& weight, const TensorView& bias, bool silu,
                          const std::vector<int64_t>& slots, const TensorView& y) {
  const int64_t B = x.sizes[0], S = x.sizes[1], D = x.sizes[2], W = weight.sizes[1];
  for (int64_t b = 0; b < B; ++b) {
    const int64_t slot = slots[size_t(b)];
    for (int64_t d = 0; d < D; ++d) {
      if (slot < 0) {
        for (int64_t t = 0; t < S; ++t) wr(y, {b, t, d}, 0.0);
        continue;
      }
      std::vector<double> s(size_t(W - 1 + S));
      for (int64_t j = 0; j < W - 1; ++j) s[size_t(j)] = rd(state, {slot, d, j});
      for (int64_t t = 0; t < S; ++t) s[size_t(W - 1 + t)] = rd(x, {b, t, d});
      for (int64_t t = 0; t < S; ++t) {
        double a = bias.defined() ? rd(bias, {d}) : 0.0;
        for (int64_t k = 0; k < W; ++k) a += rd(weight, {d, k}) * s[size_t(t + k)];
        wr(y, {b, t, d}, silu ? a * sigmoid(a) : a);
      }
      for (int64_t j = 0; j < W - 1; ++j) wr(state, {slot, d, j}, s[size_t(S + j)]);
    }
  }
}

}  // namespace ot::gdn::ref
