// Plain fp64 causal attention and its backward (ot/attention.h), head by head.
#include <cmath>
#include <limits>
#include <vector>

#include "ot/attention.h"

namespace ot::ref {
namespace {
double at(const TensorView& v, int64_t b, int64_t h, int64_t t, int64_t d) {
  return get_as_double(v, ((b * v.sizes[1] + h) * v.sizes[2] + t) * v.sizes[3] + d);
}
void put(const TensorView& v, int64_t b, int64_t h, int64_t t, int64_t d, double x) {
  set_from_double(v, ((b * v.sizes[1] + h) * v.sizes[2] + t) * v.sizes[3] + d, x);
}
// Row t's probabilities over the keys it sees (0 beyond).
std::vector<double> probs(const TensorView& q, const TensorView& k, int64_t b, int64_t h, int64_t t, double scale, double* lse) {
  const int64_t S = k.sizes[2], D = q.sizes[3], last = S - q.sizes[2] + t;
  std::vector<double> p(static_cast<size_t>(S), 0.0);
  double m = -std::numeric_limits<double>::infinity(), l = 0;
  for (int64_t j = 0; j <= last; ++j) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += at(q, b, h, t, d) * at(k, b, h, j, d);
    p[size_t(j)] = s * scale;
    m = std::max(m, p[size_t(j)]);
  }
  for (int64_t j = 0; j <= last; ++j) l += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
  for (int64_t j = 0; j <= last; ++j) p[size_t(j)] /= l;
  if (lse) *lse = m + std::log(l);
  return p;
}
}  // namespace

void causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, double scale, const TensorView& o, const TensorView& lse) {
  const int64_t B = q.sizes[0], H = q.sizes[1], T = q.sizes[2], S = k.sizes[2], D = q.sizes[3];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        double l = 0;
        const std::vector<double> p = probs(q, k, b, h, t, scale, &l);
        set_from_double(lse, (b * H + h) * T + t, l);
        for (int64_t d = 0; d < D; ++d) {
          double s = 0;
          for (int64_t j = 0; j < S; ++j) s += p[size_t(j)] * at(v, b, h, j, d);
          put(o, b, h, t, d, s);
        }
      }
}

void causal_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v, double scale,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const int64_t B = q.sizes[0], H = q.sizes[1], T = q.sizes[2], S = k.sizes[2], D = q.sizes[3];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> gq(size_t(T * D), 0.0), gk(size_t(S * D), 0.0), gv(size_t(S * D), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<double> p = probs(q, k, b, h, t, scale, nullptr);
        std::vector<double> dp(static_cast<size_t>(S), 0.0);
        double di = 0;
        for (int64_t j = 0; j < S; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            dp[size_t(j)] += at(dout, b, h, t, d) * at(v, b, h, j, d);
            gv[size_t(j * D + d)] += p[size_t(j)] * at(dout, b, h, t, d);
          }
          di += p[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < S; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - di) * scale;
          for (int64_t d = 0; d < D; ++d) {
            gq[size_t(t * D + d)] += ds * at(k, b, h, j, d);
            gk[size_t(j * D + d)] += ds * at(q, b, h, t, d);
          }
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) put(dq, b, h, t, d, gq[size_t(t * D + d)]);
      for (int64_t j = 0; j < S; ++j)
        for (int64_t d = 0; d < D; ++d) put(dk, b, h, j, d, gk[size_t(j * D + d)]), put(dv, b, h, j, d, gv[size_t(j * D + d)]);
    }
}

}  // namespace ot::ref
