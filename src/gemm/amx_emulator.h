// A software model of the AMX tile unit (palette 1: eight tiles of up to 16 rows x 64 bytes),
// enough of it to run the AMX micro-kernel (amx_tile_block.h) where no AMX runs: LDTILECFG,
// STTILECFG, TILERELEASE, TILEZERO, TILELOADD, TILESTORED and TDPBF16PS, with the tile shape
// checks and the released-state fault of the hardware (an emulated #UD prints what failed and
// aborts, as SIGILL would end the process). State is per thread, as the tile registers are.
// The GEMM uses it instead of the hardware kernel under the knob gemm.amx_emulate (tests only:
// ~1000x slower than the tiles).
#pragma once

namespace ot::gemm::detail {

// TILERELEASE on this thread's model: what other code on the thread may do between our calls.
void amx_emulator_release();
// LDTILECFG of a configuration other than the kernel's (every tile 8 rows x 32 bytes) on this
// thread's model: another library's kernels between our calls.
void amx_emulator_load_foreign_config();

}  // namespace ot::gemm::detail
