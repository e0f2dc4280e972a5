// Portable build of the gated RMSNorm row kernels (rms_norm_gated_kernels.inc).
#include "src/gdn/rms_norm_gated_kernels.h"

#include <cmath>

#include "src/gdn/layer_row_math_generic.h"

namespace ot::gdn::detail::norm {
#define OT_NORM_SFX generic
#include "src/gdn/rms_norm_gated_kernels.inc"
}  // namespace ot::gdn::detail::norm
