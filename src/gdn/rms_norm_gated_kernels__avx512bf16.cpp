// AVX-512 BF16 build of the whole-vector gated RMSNorm kernels (rms_norm_gated_avx512.inc) for bf16
// x (y and dx bf16): those by vcvtneps2bf16, one instruction where the integer rounding took seven
// (the forward at the demo's [763, 8, 128]: 0.142-0.147 -> 0.116-0.122 ms on Zen 5). It treats
// denormal inputs as zero, so an output below 2^-126 is 0 here where the AVX-512 build rounds it.
#include <immintrin.h>

#include <cmath>

#include "src/core/cvt_avx512.h"
#include "src/gdn/rms_norm_gated_kernels.h"
#include "src/gemm/vec_math_avx512.h"

namespace ot::gdn::detail::norm {
namespace {
inline __m256i to_bf16x16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
}  // namespace
#define OT_NORM512_SFX avx512bf16
#define OT_NORM512_BF16_ONLY
#include "src/gdn/rms_norm_gated_avx512.inc"
}  // namespace ot::gdn::detail::norm
