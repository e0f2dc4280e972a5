// avx512 build of the AdamW element loop (adamw_kernels.inc).
#include "src/optim/adamw_kernels.h"

#include <cmath>

namespace ot::optim::detail {
#define OT_ADAMW_SFX avx512
#include "src/optim/adamw_kernels.inc"
}  // namespace ot::optim::detail
