// Plain references of the MoE backward operators: loops a reader can check by eye, fp64
// accumulation, element access through the views' strides.
#include <vector>

#include "ot/moe_bwd.h"
#include "src/moe/act_grad_math.h"
#include "src/moe/bwd_common.h"

namespace ot::moe::ref {

static double at2(const TensorView& v, int64_t i, int64_t j) { return get_as_double(v, i * v.sizes[1] + j); }
static double at3(const TensorView& v, int64_t g, int64_t i, int64_t j) {
  return get_as_double(v, (g * v.sizes[1] + i) * v.sizes[2] + j);
}

// One row of dz = act'(z) * dy in fp64.
static void act_grad_row(gemm::Act act, const double* z, const double* dy, int64_t n_out, double* dz) {
  if (act == gemm::Act::swiglu) {
    for (int64_t n = 0; n < n_out; ++n) detail::swiglu_grad(z[n], z[n + n_out], dy[n], &dz[n], &dz[n + n_out]);
  } else {
    for (int64_t n = 0; n < n_out; ++n) dz[n] = detail::act_grad(act, z[n], dy[n]);
  }
}

void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz) {
  bwd::check_act_backward("act_backward", act, z, dy, dz);
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
  const char* op = "grouped_matmul_backward";
  auto p = bwd::plan_grouped_matmul_backward(op, dy, x, w, group_list, opt);
  const int64_t M = p.M, K = p.K, N = p.N, G = p.G, n_out = p.n_out;
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
    for (const auto& s : p.spans) {
      if (s.group != g) continue;
      for (int64_t m = s.offset; m < s.offset + s.count; ++m) {
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

}  // namespace ot::moe::ref
