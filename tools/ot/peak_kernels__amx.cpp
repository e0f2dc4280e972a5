// AMX bf16 tile loop for `ot peak` (called only when the CPU and OS grant AMX): four C tiles fed by
// two A and two B tiles of non-zero bf16 data, no memory traffic inside the loop.
#include <immintrin.h>

#include <cstdint>

#include "src/gemm/amx_tile_block.h"

namespace ot::cli::peak {

float amx_loop(int64_t iters) {
  static constexpr gemm::detail::TileConfig cfg = gemm::detail::amx_kernel_config();  // the GEMM kernel's: 16 rows x 64 bytes
  _tile_loadconfig(&cfg);
  alignas(64) static uint16_t ab[16 * 32];
  alignas(64) static float c[16 * 16];
  for (int i = 0; i < 16 * 32; ++i) ab[i] = uint16_t(0x3c00 + (i & 0x7f));  // ~0.0078 .. 0.0156
  _tile_loadd(4, ab, 64); _tile_loadd(5, ab, 64); _tile_loadd(6, ab, 64); _tile_loadd(7, ab, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

}  // namespace ot::cli::peak
