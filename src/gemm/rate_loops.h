// Register-only loops that time the multipliers for `ot peak`, which reports their rates and whether
// their ratio agrees with the bf16 kernel the GEMM takes on this CPU (bf16_dot_preferred, driver.cpp). Each runs iters x 12 independent
// accumulator steps on non-zero data (all-zero operands can run faster and overstate the peak) and
// returns a checksum so nothing is optimised away.
#pragma once
#include <cstdint>

namespace ot::gemm::detail {

float fma_loop_avx512(int64_t iters);  // 12 zmm FMAs an iteration (rate_loops__avx512.cpp; AVX-512F)
float bf16_dot_loop(int64_t iters);    // 12 zmm vdpbf16ps an iteration (rate_loops__avx512bf16.cpp; AVX-512 BF16)
constexpr int64_t kFmaLoopFlops = 12 * 16 * 2;      // per iteration: 16 lanes x (multiply + add)
constexpr int64_t kBf16DotLoopFlops = 12 * 16 * 4;  // per iteration: 16 lanes x 2 products + 2 sums
float int8_dot_loop(int64_t iters);  // 12 zmm vpdpbusd an iteration (rate_loops__avx512.cpp; AVX512_VNNI)
constexpr int64_t kInt8DotLoopOps = 12 * 16 * 8;    // per iteration: 16 lanes x 4 products + 4 sums

}  // namespace ot::gemm::detail
