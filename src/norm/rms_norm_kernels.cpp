// Portable build of the RMSNorm row kernels (rms_norm_kernels.inc).
#include "src/norm/rms_norm_kernels.h"

#include <cmath>
#include <vector>

#include "ot/numeric.h"

namespace ot::norm_detail {
#define OT_RMS_SFX generic
#include "src/norm/rms_norm_kernels.inc"
}  // namespace ot::norm_detail
