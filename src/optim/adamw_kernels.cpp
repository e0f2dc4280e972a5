// generic build of the AdamW element loop (adamw_kernels.inc).
#include "src/optim/adamw_kernels.h"

#include <cmath>

namespace ot::optim::detail {
#define OT_ADAMW_SFX generic
#include "src/optim/adamw_kernels.inc"
}  // namespace ot::optim::detail
