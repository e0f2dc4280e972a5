// Grouped matmul, finalize and final-optimizer-mm references: plain loops in fp64 over the row
// blocks and rows.
#include "src/ref/moe_grouped_ref.h"

#include <vector>

#include "src/ref/act_math.h"
#include "src/ref/group_list.h"

namespace ot::moe::refimpl {

Tensor grouped_matmul(const TensorView& x, const TensorView& weight, const TensorView& group_list, GroupListType type, const TensorView& bias,
                      gemm::Act act) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(2);
  const int64_t n_out = act == gemm::Act::swiglu ? N / 2 : N;  // swiglu: columns [gate | up]
  std::vector<int64_t> group = refgroups::group_of_rows(group_list, int(type), M);
  Tensor y = Tensor::empty(x.dtype, {M, n_out});
  std::vector<double> acc(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    TensorView w = weight.select(0, group[size_t(m)]);  // [K, N], any strides
    for (int64_t n = 0; n < N; ++n) {
      double a = bias.defined() ? get_as_double(bias, group[size_t(m)] * N + n) : 0.0;
      for (int64_t k = 0; k < K; ++k) a += get_as_double(x, m * K + k) * get_as_double(w, k * N + n);
      acc[size_t(n)] = a;
    }
    for (int64_t n = 0; n < n_out; ++n) {
      double v = act == gemm::Act::swiglu ? refmath::silu(acc[size_t(n)]) * acc[size_t(n + n_out)] : refmath::activate(act, acc[size_t(n)]);
      set_from_double(y, m * n_out + n, v);
    }
  }
  return y;
}

Tensor finalize_routing(const TensorView& ex, const TensorView& idx, const TensorView& x1, const TensorView& x2, const TensorView& bias,
                        const TensorView& scales, const TensorView& expert_idx, int mode) {
  const int64_t H = ex.size(-1), K = scales.defined() ? scales.size(1) : 1, N = idx.size(0) / K;
  Tensor out = Tensor::empty(ex.dtype, {N, H});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0;
      if (x1.defined()) acc += get_as_double(x1, n * H + h);
      if (x2.defined()) acc += get_as_double(x2, n * H + h);
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = int64_t(get_as_double(idx, mode <= 1 ? k * N + n : n * K + k));
        double row = d < 0 ? 0.0 : get_as_double(ex, d * H + h);  // -1: a dropped pair
        if (bias.defined()) row += get_as_double(bias, int64_t(get_as_double(expert_idx, n * K + k)) * H + h);
        acc += (scales.defined() ? get_as_double(scales, n * K + k) : 1.0) * row;
      }
      set_from_double(out, n * H + h, acc);
    }
  return out;
}

Tensor final_optimizer_mm(const TensorView& x, const TensorView& weight, const TensorView& idx) {
  const int64_t T = x.size(0), H = x.size(1), I = weight.size(2);
  Tensor y = Tensor::empty(x.dtype, {T, I});
  for (int64_t t = 0; t < T; ++t) {
    TensorView w = weight.select(0, int64_t(get_as_double(idx, t)));  // [H, I], any strides
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += get_as_double(x, t * H + h) * get_as_double(w, h * I + i);
      set_from_double(y, t * I + i, s);
    }
  }
  return y;
}

}  // namespace ot::moe::refimpl
