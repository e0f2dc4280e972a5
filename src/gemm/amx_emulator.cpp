// The software model of the AMX tile unit (amx_emulator.h) and the AMX micro-kernel on it.
#include "src/gemm/amx_emulator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "src/gemm/amx_tile_block.h"

namespace ot::gemm::detail {

namespace {

constexpr int kTiles = 8, kMaxRows = 16, kRowBytes = 64;

struct TileUnit {
  TileConfig cfg;  // palette 0: released (the INIT state)
  alignas(64) unsigned char data[kTiles][kMaxRows][kRowBytes] = {};
};
thread_local TileUnit g_unit;

[[noreturn]] void fault(const char* what, int tile) {
  std::fprintf(stderr, "ops_transformer AMX emulator: #UD: %s (tile %d)\n", what, tile);
  std::abort();
}

void check_tile(int t, const char* op) {
  if (g_unit.cfg.palette == 0) fault(op, t);  // a tile instruction while the tiles are released
  if (g_unit.cfg.rows[t] == 0 || g_unit.cfg.colsb[t] == 0) fault("tile not configured", t);
}

float bf16_to_f32_daz(uint16_t h) {
  if ((h & 0x7f80) == 0) h &= 0x8000;  // TDPBF16PS treats denormal inputs as zero
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct EmulatedTiles {
  static void store_config(TileConfig* cfg) {
    if (g_unit.cfg.palette == 0) *cfg = TileConfig{};
    else *cfg = g_unit.cfg;
  }
  static void load_config(const TileConfig* cfg) {
    if (cfg->palette > 1) fault("LDTILECFG: palette > 1", -1);
    for (int t = 0; t < kTiles; ++t)
      if (cfg->palette == 1 && (cfg->rows[t] > kMaxRows || cfg->colsb[t] > kRowBytes)) fault("LDTILECFG: tile larger than 16 x 64 bytes", t);
    g_unit = TileUnit{};  // loading a configuration zeroes the tile data
    if (cfg->palette == 1) g_unit.cfg = *cfg;
  }
  template <int T> static void zero() {
    check_tile(T, "TILEZERO while released");
    std::memset(g_unit.data[T], 0, sizeof g_unit.data[T]);
  }
  template <int T> static void load(const void* p, long stride) {
    check_tile(T, "TILELOADD while released");
    std::memset(g_unit.data[T], 0, sizeof g_unit.data[T]);
    for (int r = 0; r < g_unit.cfg.rows[T]; ++r) std::memcpy(g_unit.data[T][r], static_cast<const char*>(p) + r * stride, g_unit.cfg.colsb[T]);
  }
  template <int T> static void store(void* p, long stride) {
    check_tile(T, "TILESTORED while released");
    for (int r = 0; r < g_unit.cfg.rows[T]; ++r) std::memcpy(static_cast<char*>(p) + r * stride, g_unit.data[T][r], g_unit.cfg.colsb[T]);
  }
  // C[m][n] += A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1], two fp32 adds in that order (the ISA's
  // pseudo-code); the bf16 products are exact in fp32.
  template <int C, int A, int B> static void dp() {
    check_tile(C, "TDPBF16PS while released"), check_tile(A, "TDPBF16PS while released"), check_tile(B, "TDPBF16PS while released");
    const TileConfig& g = g_unit.cfg;
    if (C == A || C == B || A == B) fault("TDPBF16PS: operands must be distinct tiles", C);
    if (g.colsb[A] / 4 != g.rows[B] || g.colsb[C] != g.colsb[B] || g.rows[C] != g.rows[A]) fault("TDPBF16PS: tile shapes do not match", C);
    const int M = g.rows[C], N = g.colsb[C] / 4, K = g.colsb[A] / 4;
    for (int m = 0; m < M; ++m) {
      float acc[kRowBytes / 4];
      std::memcpy(acc, g_unit.data[C][m], sizeof acc);
      for (int k = 0; k < K; ++k) {
        uint16_t a[2], b[kRowBytes / 2];
        std::memcpy(a, g_unit.data[A][m] + 4 * k, 4);
        std::memcpy(b, g_unit.data[B][k], sizeof b);
        for (int n = 0; n < N; ++n) {
          acc[n] += bf16_to_f32_daz(a[0]) * bf16_to_f32_daz(b[2 * n]);
          acc[n] += bf16_to_f32_daz(a[1]) * bf16_to_f32_daz(b[2 * n + 1]);
        }
      }
      std::memset(g_unit.data[C][m], 0, kRowBytes);
      std::memcpy(g_unit.data[C][m], acc, size_t(g.colsb[C]));
    }
  }
};

}  // namespace

void kernel_amx_bf16_emulated(int /*mr*/, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  amx_tile_block<EmulatedTiles>(kc, a, lda, b, c, ldc, load_c);
}

void amx_emulator_release() { g_unit = TileUnit{}; }

void amx_emulator_load_foreign_config() {
  TileConfig cfg;
  cfg.palette = 1;
  for (int t = 0; t < kTiles; ++t) cfg.rows[t] = 8, cfg.colsb[t] = 32;
  EmulatedTiles::load_config(&cfg);
}

}  // namespace ot::gemm::detail
