// Portable build of the gated RMSNorm row kernels (rms_norm_gated_kernels.inc).
#include "src/gdn/rms_norm_gated_kernels.h"

#include <cmath>

#include "src/gdn/layer_row_math_generic.h"

namespace ot::gdn::detail::norm {
#define OT_NORM_SFX generic
#include "src/gdn/rms_norm_gated_kernels.inc"

// Here, not in the AVX-512 builds: the two of them share it.
knobs::Knob g_gate_lockstep("norm.gate_lockstep", 1, 0, 1, "rms_norm_gated (AVX-512, norm before gate): compute the gates 8 vectors in lockstep (0 = one at a time)");
}  // namespace ot::gdn::detail::norm
