// AVX-512 build of the whole-vector gated RMSNorm kernels (rms_norm_gated_avx512.inc): bf16 outputs
// rounded by integer arithmetic (no bf16 conversion instruction at this ISA level).
#include <immintrin.h>

#include <cmath>

#include "src/core/cvt_avx512.h"
#include "src/gdn/rms_norm_gated_kernels.h"
#include "src/gemm/vec_math_avx512.h"

namespace ot::gdn::detail::norm {
namespace {
inline __m256i to_bf16x16(__m512 v) { return simd::f32_to_bf16x16(v); }
}  // namespace
#define OT_NORM512_SFX avx512
#include "src/gdn/rms_norm_gated_avx512.inc"
}  // namespace ot::gdn::detail::norm
