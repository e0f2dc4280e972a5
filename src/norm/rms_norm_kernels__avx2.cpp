// AVX2 build of the portable RMSNorm row kernels (rms_norm_kernels.inc); dispatched by the kernel
// lists of rms_norm.cpp.
#include "src/norm/rms_norm_kernels.h"

#include <cmath>
#include <vector>

#include "ot/numeric.h"

namespace ot::norm_detail {
#define OT_RMS_SFX avx2
#include "src/norm/rms_norm_kernels.inc"
}  // namespace ot::norm_detail
