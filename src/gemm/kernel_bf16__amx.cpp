// AMX bf16 micro-kernel on the hardware tile unit (body: amx_tile_block.h). Compiled everywhere,
// dispatched only when CPUID and the OS grant AMX (cannot run on AMD); the same body runs on the
// software model (amx_emulator.cpp) in the tests.
#include <immintrin.h>

#include "src/gemm/amx_tile_block.h"

namespace ot::gemm::detail {

namespace {

// GCC's tile intrinsics paste the tile number into the instruction's text, so it must be a
// literal: OP(n) for the literal n equal to the template's T.
#define OT_TILE_SWITCH(T, OP)                                                                                 \
  if constexpr ((T) == 0) { OP(0); } else if constexpr ((T) == 1) { OP(1); } else if constexpr ((T) == 2) { \
    OP(2);                                                                                                    \
  } else if constexpr ((T) == 3) { OP(3); } else if constexpr ((T) == 4) { OP(4); } else if constexpr ((T) == 5) { \
    OP(5);                                                                                                    \
  } else if constexpr ((T) == 6) { OP(6); } else {                                                            \
    static_assert((T) == 7, "tiles 0-7");                                                                     \
    OP(7);                                                                                                    \
  }

struct HardwareTiles {
  static void store_config(TileConfig* cfg) { _tile_storeconfig(cfg); }
  static void load_config(const TileConfig* cfg) { _tile_loadconfig(cfg); }
  template <int T> static void zero() {
#define OT_OP(n) _tile_zero(n)
    OT_TILE_SWITCH(T, OT_OP)
#undef OT_OP
  }
  template <int T> static void load(const void* p, long stride) {
#define OT_OP(n) _tile_loadd(n, p, stride)
    OT_TILE_SWITCH(T, OT_OP)
#undef OT_OP
  }
  template <int T> static void store(void* p, long stride) {
#define OT_OP(n) _tile_stored(n, p, stride)
    OT_TILE_SWITCH(T, OT_OP)
#undef OT_OP
  }
  // The kernel's products all take A in tile 6 and B in tile 7.
  // Accumulators are tiles 0-5 only: clang checks the tile operands of every branch, even the
  // discarded ones, and rejects a product into tile 6 or 7 (its own source).
  template <int C, int A, int B> static void dp() {
    static_assert(A == 6 && B == 7, "A in tile 6, B in tile 7");
    static_assert(C >= 0 && C < 6, "accumulators in tiles 0-5");
    if constexpr (C == 0) { _tile_dpbf16ps(0, 6, 7); } else if constexpr (C == 1) { _tile_dpbf16ps(1, 6, 7); }
    else if constexpr (C == 2) { _tile_dpbf16ps(2, 6, 7); } else if constexpr (C == 3) { _tile_dpbf16ps(3, 6, 7); }
    else if constexpr (C == 4) { _tile_dpbf16ps(4, 6, 7); } else { _tile_dpbf16ps(5, 6, 7); }
  }
};
#undef OT_TILE_SWITCH

}  // namespace

void kernel_amx_bf16(int /*mr*/, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  amx_tile_block<HardwareTiles>(kc, a, lda, b, c, ldc, load_c);
}

}  // namespace ot::gemm::detail
