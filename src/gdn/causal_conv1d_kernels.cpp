// Portable build of the causal conv1d kernels (causal_conv1d_kernels.inc).
#include "src/gdn/causal_conv1d_kernels.h"
#include "src/gdn/layer_row_math_generic.h"

namespace ot::gdn::detail::conv::generic {
#include "src/gdn/causal_conv1d_kernels.inc"
}  // namespace ot::gdn::detail::conv::generic
