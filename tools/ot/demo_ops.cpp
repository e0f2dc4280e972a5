#include "demo_ops.h"

#include <algorithm>
#include <xmmintrin.h>
#include <cmath>
#include <cstring>
#include <string>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/gdn_layer.h"
#include "ot/norm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"

namespace ot::demo {

namespace demo_ops_local {

// Row t of a [T, W] view (last dim contiguous) as floats.
void load_row(const TensorView& x, int64_t t, float* dst) {
  const char* p = static_cast<const char*>(x.data) + size_t(t * x.stride(0)) * dtype_size(x.dtype);
  convert_to_f32(p, x.dtype, dst, x.size(-1));
}
void store_row(const TensorView& x, int64_t t, const float* src) {
  char* p = static_cast<char*>(x.data) + size_t(t * x.stride(0)) * dtype_size(x.dtype);
  convert_from_f32(src, p, x.dtype, x.size(-1));
}

// Rows [0, T) in parallel with per-thread float scratch of `width` floats times `bufs`. Small
// inputs (decode) run on the calling thread: waking the pool costs more than the work.
template <class F> void for_rows(int64_t T, int64_t width, int bufs, F&& fn) {
  auto body = [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(size_t(width * bufs));
    for (int64_t t = t0; t < t1; ++t) fn(t, scratch.data());
  };
  if (T * width < (int64_t(1) << 16)) body(0, T);
  else parallel_for(T, body);
}

}  // namespace demo_ops_local

Linear make_linear(const Tensor& weight, bool keep_unpacked) {
  Linear l;
  l.out = weight.size(0);
  l.in = weight.size(1);
  l.packed = gemm::prepack(weight.view(), gemm::BLayout::NK);
  if (keep_unpacked) l.weight = weight;
  return l;
}

static void linear_operands(const TensorView& x, const Linear& w, const TensorView& out, int64_t* M, gemm::AOperand* a,
                            gemm::COperand* c) {
  OT_CHECK(x.ndim == 2 && x.size(1) == w.in && x.last_dim_contiguous(), "linear", "x", detail::cat("[T, ", w.in, "]"), x.shape_str());
  OT_CHECK(out.ndim == 2 && out.size(0) == x.size(0) && out.size(1) == w.out, "linear", "out", detail::cat("[T, ", w.out, "]"),
           out.shape_str());
  *M = x.size(0);
  *a = {x.data, x.dtype, x.stride(0), nullptr};
  *c = {out.data, out.dtype, out.stride(0)};
}

void linear(const char* name, const TensorView& x, const Linear& w, const TensorView& out, bool accumulate) {
  int64_t M;
  gemm::AOperand a;
  gemm::COperand c;
  linear_operands(x, w, out, &M, &a, &c);
  trace::OpScope scope(name);
  scope.kernel(gemm::kernel_name(x.dtype, w.packed.dtype(), M)).args(x.shape_str() + " x [" + std::to_string(w.out) + ", " + std::to_string(w.in) + "]");
  scope.flops(2.0 * M * w.in * w.out).bytes(double(w.packed.bytes()) + double(x.nbytes()) + double(out.nbytes()) * (accumulate ? 2 : 1));
  gemm::Epilogue ep;
  ep.accumulate = accumulate;
  gemm::gemm(M, a, w.packed, c, ep);
}

void linear_ref(const TensorView& x, const Linear& w, const TensorView& out, bool accumulate) {
  OT_CHECK(w.weight.defined(), "linear", "weight", "the unpacked weight (kept for verification)", "none");
  int64_t M;
  gemm::AOperand a;
  gemm::COperand c;
  linear_operands(x, w, out, &M, &a, &c);
  gemm::Epilogue ep;
  ep.accumulate = accumulate;
  gemm::ref::gemm(M, a, w.weight.view(), gemm::BLayout::NK, c, ep);
}

void embedding(const TensorView& table, const std::vector<int32_t>& ids, const TensorView& out) {
  trace::OpScope scope("embedding");
  const int64_t H = table.size(1);
  scope.args(detail::cat(ids.size(), " tokens x ", H)).bytes(2.0 * double(ids.size()) * H * dtype_size(table.dtype));
  const size_t row_bytes = size_t(H) * dtype_size(table.dtype);
  OT_CHECK(out.dtype == table.dtype && out.size(1) == H, "embedding", "out", "rows like the table", out.shape_str());
  for (size_t t = 0; t < ids.size(); ++t)
    std::memcpy(static_cast<char*>(out.data) + t * size_t(out.stride(0)) * dtype_size(out.dtype),
                static_cast<const char*>(table.data) + size_t(ids[t]) * row_bytes, row_bytes);
}

Tensor rms_norm(const TensorView& x, const float* w, double eps) {
  return ot::rms_norm(x, TensorView(const_cast<float*>(w), DType::f32, {x.size(1)}), float(eps)).y;
}

Tensor gated_rms_norm(const TensorView& o, const TensorView& z, const TensorView& w, double eps) {
  trace::OpScope scope("gated_rms_norm");
  const int64_t T = o.size(0), HV = o.size(1), DV = o.size(2);
  scope.args(o.shape_str()).flops(10.0 * T * HV * DV).bytes(double(o.nbytes() + z.nbytes()) + double(T * HV * DV * dtype_size(o.dtype)));
  gdn::RmsNormGatedOptions opt;
  opt.eps = float(eps);
  opt.norm_before_gate = true;
  opt.group_size = DV;
  return gdn::rms_norm_gated(o.reshape({T, HV * DV}), z, w, opt).y;
}

// The plain forms (double sums, one thread): what the fast norms are verified against.
void rms_norm_ref(const TensorView& x, const float* w, double eps, const TensorView& out) {
  using namespace demo_ops_local;
  const int64_t T = x.size(0), H = x.size(1);
  std::vector<float> r(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    load_row(x, t, r.data());
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += double(r[size_t(i)]) * r[size_t(i)];
    const double s = 1 / std::sqrt(ss / double(H) + eps);
    for (int64_t i = 0; i < H; ++i) r[size_t(i)] = float(r[size_t(i)] * s * w[i]);
    store_row(out, t, r.data());
  }
}

void gated_rms_norm_ref(const TensorView& o, const TensorView& z, const float* w, double eps, const TensorView& out) {
  using namespace demo_ops_local;
  const int64_t T = o.size(0), HV = o.size(1), DV = o.size(2);
  const TensorView o2 = o.reshape({T, HV * DV});
  std::vector<float> r(static_cast<size_t>(HV * DV)), zr(static_cast<size_t>(HV * DV));
  for (int64_t t = 0; t < T; ++t) {
    load_row(o2, t, r.data());
    load_row(z, t, zr.data());
    for (int64_t h = 0; h < HV; ++h) {
      float* rh = r.data() + h * DV;
      double ss = 0;
      for (int64_t i = 0; i < DV; ++i) ss += double(rh[i]) * rh[i];
      const double s = 1 / std::sqrt(ss / double(DV) + eps);
      for (int64_t i = 0; i < DV; ++i) {
        const double zv = zr[size_t(h * DV + i)];
        rh[i] = float(rh[i] * s * w[i] * (zv / (1 + std::exp(-zv))));
      }
    }
    store_row(out, t, r.data());
  }
}

void gdn_gates(const TensorView& a, const TensorView& b, const float* A_log, const float* dt_bias, const TensorView& g,
               const TensorView& beta) {
  using namespace demo_ops_local;
  trace::OpScope scope("gdn_gates");
  const int64_t T = a.size(0), HV = a.size(1);
  scope.args(a.shape_str()).flops(8.0 * T * HV).bytes(double(a.nbytes() + b.nbytes() + g.nbytes() + beta.nbytes()));
  for_rows(T, HV, 2, [&](int64_t t, float* buf) {
    float* ar = buf;
    float* br = buf + HV;
    load_row(a, t, ar);
    load_row(b, t, br);
    for (int64_t h = 0; h < HV; ++h) {
      double u = double(ar[h]) + dt_bias[h];
      double softplus = u > 20 ? u : std::log1p(std::exp(u));
      ar[h] = float(-std::exp(double(A_log[h])) * softplus);
      br[h] = float(1 / (1 + std::exp(-double(br[h]))));
    }
    store_row(g, t, ar);
    store_row(beta, t, br);
  });
}

void gather_rows(const TensorView& x, const std::vector<int64_t>& rows, const TensorView& out) {
  trace::OpScope scope("gather_rows");
  const size_t row_bytes = size_t(x.size(1)) * dtype_size(x.dtype);
  scope.args(detail::cat(rows.size(), " rows of ", x.shape_str())).bytes(2.0 * double(rows.size() * row_bytes));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.data) + i * size_t(out.stride(0)) * dtype_size(out.dtype),
                static_cast<const char*>(x.data) + size_t(rows[i] * x.stride(0)) * dtype_size(x.dtype), row_bytes);
}

// The first index of the largest of row[0, V): lane-wise maxima over 16-wide chunks in four SSE
// registers (std::max_element's compare-and-branch chain ran ~1 ns an element: 21 us a decode
// step), then the first chunk holding that value. NaN-free rows (the demo's logits are finite).
static int64_t argmax_row(const float* row, int64_t V) {
  constexpr int64_t W = 16;
  const int64_t whole = V / W * W;
  float m = V > 0 ? row[0] : 0.f;
  if (whole > 0) {
    __m128 l0 = _mm_loadu_ps(row), l1 = _mm_loadu_ps(row + 4), l2 = _mm_loadu_ps(row + 8), l3 = _mm_loadu_ps(row + 12);
    for (int64_t i = W; i < whole; i += W) {
      l0 = _mm_max_ps(l0, _mm_loadu_ps(row + i)), l1 = _mm_max_ps(l1, _mm_loadu_ps(row + i + 4));
      l2 = _mm_max_ps(l2, _mm_loadu_ps(row + i + 8)), l3 = _mm_max_ps(l3, _mm_loadu_ps(row + i + 12));
    }
    alignas(16) float lane[4];
    _mm_store_ps(lane, _mm_max_ps(_mm_max_ps(l0, l1), _mm_max_ps(l2, l3)));
    for (float x : lane) m = std::max(m, x);
  }
  for (int64_t i = whole; i < V; ++i) m = std::max(m, row[i]);
  const __m128 mv = _mm_set1_ps(m);
  for (int64_t i = 0; i < whole; i += W) {
    const __m128 e = _mm_or_ps(_mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(row + i), mv), _mm_cmpeq_ps(_mm_loadu_ps(row + i + 4), mv)),
                               _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(row + i + 8), mv), _mm_cmpeq_ps(_mm_loadu_ps(row + i + 12), mv)));
    if (_mm_movemask_ps(e))
      for (int64_t j = 0;; ++j)
        if (row[i + j] == m) return i + j;
  }
  for (int64_t i = whole; i < V; ++i)
    if (row[i] == m) return i;
  return 0;
}

std::vector<int32_t> argmax_rows(const TensorView& logits) {
  using namespace demo_ops_local;
  trace::OpScope scope("argmax");
  const int64_t N = logits.size(0), V = logits.size(1);
  scope.args(logits.shape_str()).flops(double(N * V)).bytes(double(logits.nbytes()));
  std::vector<int32_t> r(static_cast<size_t>(N));
  if (logits.dtype == DType::f32 && logits.stride(1) == 1) {  // the model's fp32 logits: read in place
    for (int64_t n = 0; n < N; ++n) r[size_t(n)] = int32_t(argmax_row(logits.ptr<float>() + n * logits.stride(0), V));
    return r;
  }
  for_rows(N, V, 1, [&](int64_t n, float* row) {
    load_row(logits, n, row);
    r[size_t(n)] = int32_t(argmax_row(row, V));
  });
  return r;
}

void store_states(const TensorView& state, const std::vector<int32_t>& slots, const TensorView& cache) {
  trace::OpScope scope("gdn_cache_store");
  const size_t per = size_t(state.numel() / state.size(0));
  scope.args(state.shape_str()).bytes(2.0 * double(state.nbytes()));
  for (size_t n = 0; n < slots.size(); ++n)
    std::memcpy(cache.ptr<float>() + size_t(slots[n]) * per, state.ptr<float>() + n * per, per * sizeof(float));
}

double normalised_error(const TensorView& fast, const TensorView& ref) {
  OT_CHECK(fast.numel() == ref.numel(), "verify", "output", detail::cat(ref.numel(), " elements"), fast.numel());
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double f = get_as_double(fast, i), r = get_as_double(ref, i);
    if (!std::isfinite(f)) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(f - r));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

}  // namespace ot::demo
