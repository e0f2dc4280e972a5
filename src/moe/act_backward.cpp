// act_backward: dz = act'(z) * dy row by row in fp32 (the GEMM epilogue's activations).
#include <vector>

#include "ot/cpu.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/act_grad_math.h"
#include "src/moe/bwd_common.h"

namespace ot::moe {

namespace bwd {
// Rows [m0, m1) of z (any float dtype, row stride ldz) and dy -> dz (dtype of dz), fp32 math.
void act_backward_rows(gemm::Act act, int64_t m0, int64_t m1, int64_t N, const void* z, DType zt, int64_t ldz, const void* dy,
                       DType dyt, int64_t lddy, void* dz, DType dzt, int64_t lddz) {
  int64_t n_out = act == gemm::Act::swiglu ? N / 2 : N;
  std::vector<float> zr(static_cast<size_t>(N)), dyr(static_cast<size_t>(n_out)), dzr(static_cast<size_t>(N));
  auto row = [](const void* p, DType t, int64_t ld, int64_t m) { return static_cast<const char*>(p) + m * ld * int64_t(dtype_size(t)); };
  for (int64_t m = m0; m < m1; ++m) {
    convert_to_f32(row(z, zt, ldz, m), zt, zr.data(), N);
    convert_to_f32(row(dy, dyt, lddy, m), dyt, dyr.data(), n_out);
    if (act == gemm::Act::swiglu) {
      for (int64_t n = 0; n < n_out; ++n) detail::swiglu_grad(zr[size_t(n)], zr[size_t(n + n_out)], dyr[size_t(n)], &dzr[size_t(n)], &dzr[size_t(n + n_out)]);
    } else {
      for (int64_t n = 0; n < N; ++n) dzr[size_t(n)] = detail::act_grad(act, zr[size_t(n)], dyr[size_t(n)]);
    }
    convert_from_f32(dzr.data(), const_cast<char*>(row(dz, dzt, lddz, m)), dzt, N);
  }
}
}  // namespace bwd

void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz) {
  bwd::check_act_backward("act_backward", act, z, dy, dz);
  if (cpu::force_ref()) return ref::act_backward(act, z, dy, dz);
  trace::OpScope scope("act_backward");
  scope.kernel("fp32").args(z.shape_str() + " " + gemm::act_name(act));
  int64_t M = z.sizes[0], N = z.sizes[1];
  bwd::parallel_rows(M, N * 8, [&](int64_t m0, int64_t m1) {
    bwd::act_backward_rows(act, m0, m1, N, z.data, z.dtype, z.strides[0], dy.data, dy.dtype, dy.strides[0], dz.data, dz.dtype,
                           dz.strides[0]);
  });
}

}  // namespace ot::moe
