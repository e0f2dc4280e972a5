// AVX2 build of the gated RMSNorm row kernels (rms_norm_gated_kernels.inc); dispatched by cpu::has.
#include "src/gdn/rms_norm_gated_kernels.h"

#include <cmath>

#include "src/gdn/layer_row_math_avx2.h"

namespace ot::gdn::detail::norm {
#define OT_NORM_SFX avx2
#include "src/gdn/rms_norm_gated_kernels.inc"
}  // namespace ot::gdn::detail::norm
