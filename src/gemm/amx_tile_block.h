// The AMX bf16 micro-kernel's body, written once over a tile backend: the hardware tile unit
// (kernel_bf16__amx.cpp) or the software model of it (amx_emulator.cpp), which runs the same
// code, tile numbers, strides and configuration on machines without AMX, so the tests check this
// path everywhere (no machine of this project has exposed AMX).
//
// A 32 x 48 fp32 block held in six C tiles (2 row blocks x 3 column blocks), tile 6 = A (16 rows x
// 32 k), tile 7 = B (16 k-pairs x 16 columns, read from the 48-wide vnni panel with a 192-byte row
// stride). A is row-major bf16, zero-padded to 32 rows, and kc % 32 == 0.
//
// Tiles: store_config(TileConfig*), load_config(const TileConfig*), and, T / C, A, B tile numbers,
// zero<T>(), load<T>(ptr, stride), store<T>(ptr, stride), dp<C, A, B>() (C += A x B, bf16 pairs).
#pragma once
#include <cstdint>
#include <cstring>

#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// LDTILECFG's 64-byte operand (palette 1: up to 16 rows of up to 64 bytes a tile).
struct alignas(64) TileConfig {
  uint8_t palette = 0, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// Tiles 0-7 as 16 rows x 64 bytes.
constexpr TileConfig amx_kernel_config() {
  TileConfig cfg;
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  return cfg;
}

// Loads the kernel's configuration unless the tile unit holds it already. Checked on every call,
// not remembered per thread: other code on the thread (oneDNN's AMX kernels under PyTorch, say)
// may load its own configuration or release the tiles between our calls, and a tile instruction
// after a release faults (#UD). STTILECFG writes zeros while the tiles are released.
template <class Tiles>
inline void ensure_amx_config() {
  static constexpr TileConfig want = amx_kernel_config();
  TileConfig cur;
  Tiles::store_config(&cur);
  if (std::memcmp(&cur, &want, sizeof want) != 0) Tiles::load_config(&want);
}

template <class Tiles>
inline void amx_tile_block(int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  ensure_amx_config<Tiles>();
  auto A = static_cast<const uint16_t*>(a);
  auto B = static_cast<const uint16_t*>(b);
  const long cstride = long(ldc * 4), astride = long(lda * 2), bstride = long(kNR * 2 * 2);
  float* c1 = c + 16 * ldc;  // the second row block
  if (load_c) {
    Tiles::template load<0>(c, cstride), Tiles::template load<1>(c + 16, cstride), Tiles::template load<2>(c + 32, cstride);
    Tiles::template load<3>(c1, cstride), Tiles::template load<4>(c1 + 16, cstride), Tiles::template load<5>(c1 + 32, cstride);
  } else {
    Tiles::template zero<0>(), Tiles::template zero<1>(), Tiles::template zero<2>();
    Tiles::template zero<3>(), Tiles::template zero<4>(), Tiles::template zero<5>();
  }
  for (int64_t k = 0; k < kc; k += 32) {
    const uint16_t* bk = B + k * kNR;  // 16 k-pairs from pair k/2
    const uint16_t* a0 = A + k;
    const uint16_t* a1 = A + 16 * lda + k;
    Tiles::template load<7>(bk, bstride);
    Tiles::template load<6>(a0, astride), Tiles::template dp<0, 6, 7>();
    Tiles::template load<6>(a1, astride), Tiles::template dp<3, 6, 7>();
    Tiles::template load<7>(bk + 32, bstride);
    Tiles::template load<6>(a0, astride), Tiles::template dp<1, 6, 7>();
    Tiles::template load<6>(a1, astride), Tiles::template dp<4, 6, 7>();
    Tiles::template load<7>(bk + 64, bstride);
    Tiles::template load<6>(a0, astride), Tiles::template dp<2, 6, 7>();
    Tiles::template load<6>(a1, astride), Tiles::template dp<5, 6, 7>();
  }
  Tiles::template store<0>(c, cstride), Tiles::template store<1>(c + 16, cstride), Tiles::template store<2>(c + 32, cstride);
  Tiles::template store<3>(c1, cstride), Tiles::template store<4>(c1 + 16, cstride), Tiles::template store<5>(c1 + 32, cstride);
}

}  // namespace ot::gemm::detail
