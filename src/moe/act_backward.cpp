// act_backward: dz = act'(z) * dy row by row in fp32 (the GEMM epilogue's activations), and the
// SwiGLU passes of the MoE training path (AVX-512 in act_backward__avx512.cpp, AVX2 in
// act_backward__avx2.cpp, scalar here).
#include <initializer_list>
#include <vector>

#include "ot/cpu.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
#include "src/moe/act_grad_math.h"
#include "src/moe/bwd_common.h"

namespace ot::moe {

namespace bwd {

namespace {

// The vector form of the SwiGLU passes for these storage dtypes on this CPU (AVX-512 first).
enum class Vec { none, avx2, avx512 };
Vec vector_form(std::initializer_list<DType> ts) {
  for (DType t : ts)
    if (t != DType::f32 && t != DType::bf16) return Vec::none;
  return cpu::has(cpu::Isa::avx512) ? Vec::avx512 : cpu::has(cpu::Isa::avx2) ? Vec::avx2 : Vec::none;
}

void swiglu_forward_rows(const SwigluFwd& p, int64_t m0, int64_t m1) {
  const int64_t N = p.N;
  const DType zr = p.zo ? p.zot : p.zt;
  std::vector<float> z(static_cast<size_t>(2 * N)), a(static_cast<size_t>(N));
  for (int64_t m = m0; m < m1; ++m) {
    convert_to_f32(row_at(p.z, p.zt, p.ldz, m), p.zt, z.data(), 2 * N);
    for (float& v : z) v = round_to(zr, v);
    if (p.zo) convert_from_f32(z.data(), row_at(p.zo, p.zot, p.ldzo, m), p.zot, 2 * N);
    for (int64_t j = 0; j < N; ++j) a[size_t(j)] = z[size_t(j)] * act_math::sigmoid(z[size_t(j)]) * z[size_t(j + N)];
    convert_from_f32(a.data(), row_at(p.a, p.at, p.lda, m), p.at, N);
  }
}

void swiglu_backward_rows(const SwigluBwd& p, int64_t m0, int64_t m1) {
  const int64_t N = p.N;
  std::vector<float> z(static_cast<size_t>(2 * N)), d(static_cast<size_t>(N)), dz(static_cast<size_t>(2 * N)), aw(static_cast<size_t>(N));
  for (int64_t m = m0; m < m1; ++m) {
    convert_to_f32(row_at(p.z, p.zt, p.ldz, m), p.zt, z.data(), 2 * N);
    convert_to_f32(row_at(p.dy, p.dyt, p.lddy, m), p.dyt, d.data(), N);
    const float s = p.scale ? p.scale[m] : 1.f;
    double dot = 0;
    for (int64_t j = 0; j < N; ++j) {
      const float g = z[size_t(j)], u = z[size_t(j + N)], sg = act_math::sigmoid(g), silu = g * sg;
      const float a = round_to(p.zt, silu * u), ds = d[size_t(j)] * s;
      dot += double(d[size_t(j)]) * a;
      aw[size_t(j)] = a * s;
      dz[size_t(j)] = ds * u * (sg * (1.f + g * (1.f - sg)));
      dz[size_t(j + N)] = ds * silu;
    }
    if (p.dot) p.dot[m] = float(dot);
    if (p.aw) convert_from_f32(aw.data(), row_at(p.aw, p.zt, p.ldaw, m), p.zt, N);
    convert_from_f32(dz.data(), row_at(p.dz, p.dzt, p.lddz, m), p.dzt, 2 * N);
  }
}

void swiglu_forward_rows(Vec v, const SwigluFwd& p, int64_t m0, int64_t m1) {
  if (v == Vec::avx512) swiglu_forward_rows_avx512(p, m0, m1);
  else if (v == Vec::avx2) swiglu_forward_rows_avx2(p, m0, m1);
  else swiglu_forward_rows(p, m0, m1);
}

void swiglu_backward_rows(Vec v, const SwigluBwd& p, int64_t m0, int64_t m1) {
  if (v == Vec::avx512) swiglu_backward_rows_avx512(p, m0, m1);
  else if (v == Vec::avx2) swiglu_backward_rows_avx2(p, m0, m1);
  else swiglu_backward_rows(p, m0, m1);
}

}  // namespace

void swiglu_forward(const SwigluFwd& p, int64_t M) {
  const Vec v = vector_form({p.zt, p.zo ? p.zot : DType::f32, p.at});
  parallel_rows(M, 2 * p.N * 8, [&](int64_t m0, int64_t m1) { swiglu_forward_rows(v, p, m0, m1); });
}

void swiglu_backward(const SwigluBwd& p, int64_t M) {
  const Vec v = vector_form({p.zt, p.dyt, p.dzt});
  parallel_rows(M, 2 * p.N * 8, [&](int64_t m0, int64_t m1) { swiglu_backward_rows(v, p, m0, m1); });
}

// Rows [m0, m1) of z (any float dtype, row stride ldz) and dy -> dz (dtype of dz), fp32 math.
void act_backward_rows(gemm::Act act, int64_t m0, int64_t m1, int64_t N, const void* z, DType zt, int64_t ldz, const void* dy,
                       DType dyt, int64_t lddy, void* dz, DType dzt, int64_t lddz) {
  if (act == gemm::Act::swiglu) {
    SwigluBwd p;
    p.N = N / 2;
    p.z = row_at(z, zt, ldz, m0); p.zt = zt; p.ldz = ldz;
    p.dy = row_at(dy, dyt, lddy, m0); p.dyt = dyt; p.lddy = lddy;
    p.dz = row_at(dz, dzt, lddz, m0); p.dzt = dzt; p.lddz = lddz;
    return swiglu_backward_rows(vector_form({zt, dyt, dzt}), p, 0, m1 - m0);
  }
  std::vector<float> zr(static_cast<size_t>(N)), dyr(static_cast<size_t>(N)), dzr(static_cast<size_t>(N));
  for (int64_t m = m0; m < m1; ++m) {
    convert_to_f32(row_at(z, zt, ldz, m), zt, zr.data(), N);
    convert_to_f32(row_at(dy, dyt, lddy, m), dyt, dyr.data(), N);
    for (int64_t n = 0; n < N; ++n) dzr[size_t(n)] = act_math::act_grad(act, zr[size_t(n)], dyr[size_t(n)]);
    convert_from_f32(dzr.data(), row_at(dz, dzt, lddz, m), dzt, N);
  }
}
}  // namespace bwd

void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz) {
  bwd::check_act_backward("act_backward", act, z, dy, dz);
  if (cpu::force_ref()) return ref::act_backward(act, z, dy, dz);
  trace::OpScope scope("act_backward");
  if (scope.active()) scope.kernel("fp32").args(z.shape_str() + " " + gemm::act_name(act));
  int64_t M = z.sizes[0], N = z.sizes[1];
  bwd::parallel_rows(M, N * 8, [&](int64_t m0, int64_t m1) {
    bwd::act_backward_rows(act, m0, m1, N, z.data, z.dtype, z.strides[0], dy.data, dy.dtype, dy.strides[0], dz.data, dz.dtype,
                           dz.strides[0]);
  });
}

}  // namespace ot::moe
