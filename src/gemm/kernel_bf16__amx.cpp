// AMX bf16 micro-kernel: a 32 x 48 fp32 tile held in six C tiles (2 row blocks x 3 column blocks),
// tile 6 = A (16 rows x 32 k), tile 7 = B (16 k-pairs x 16 columns, read from the 48-wide vnni panel
// with a 192-byte row stride). A is row-major bf16, zero-padded to 32 rows and kc % 32 == 0.
// Compiled everywhere, dispatched only when CPUID and the OS grant AMX (cannot run on AMD).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "src/gemm/internal.h"

namespace ot::gemm::detail {

namespace {
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  configured = true;
}
}  // namespace

#define OT_AMX_C(i, j) (i * 3 + j)

void kernel_amx_bf16(int /*mr*/, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  configure_tiles();
  auto A = static_cast<const uint16_t*>(a);
  auto B = static_cast<const uint16_t*>(b);
  const long cstride = long(ldc * 4), astride = long(lda * 2), bstride = long(kNR * 2 * 2);
  if (load_c) {
    _tile_loadd(0, c, cstride); _tile_loadd(1, c + 16, cstride); _tile_loadd(2, c + 32, cstride);
    _tile_loadd(3, c + 16 * ldc, cstride); _tile_loadd(4, c + 16 * ldc + 16, cstride); _tile_loadd(5, c + 16 * ldc + 32, cstride);
  } else {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5);
  }
  for (int64_t k = 0; k < kc; k += 32) {
    const uint16_t* bk = B + k * kNR;  // 16 k-pairs from pair k/2
    const uint16_t* a0 = A + k;
    const uint16_t* a1 = A + 16 * lda + k;
    _tile_loadd(7, bk, bstride);
    _tile_loadd(6, a0, astride); _tile_dpbf16ps(0, 6, 7);
    _tile_loadd(6, a1, astride); _tile_dpbf16ps(3, 6, 7);
    _tile_loadd(7, bk + 32, bstride);
    _tile_loadd(6, a0, astride); _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(6, a1, astride); _tile_dpbf16ps(4, 6, 7);
    _tile_loadd(7, bk + 64, bstride);
    _tile_loadd(6, a0, astride); _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(6, a1, astride); _tile_dpbf16ps(5, 6, 7);
  }
  _tile_stored(0, c, cstride); _tile_stored(1, c + 16, cstride); _tile_stored(2, c + 32, cstride);
  _tile_stored(3, c + 16 * ldc, cstride); _tile_stored(4, c + 16 * ldc + 16, cstride); _tile_stored(5, c + 16 * ldc + 32, cstride);
}

}  // namespace ot::gemm::detail
