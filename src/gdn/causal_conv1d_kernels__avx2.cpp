// AVX2 build of the causal conv1d kernels (causal_conv1d_kernels.inc); dispatched by cpu::has.
#include "src/gdn/causal_conv1d_kernels.h"
#include "src/gdn/layer_row_math_avx2.h"

namespace ot::gdn::detail::conv::avx2 {
#include "src/gdn/causal_conv1d_kernels.inc"
}  // namespace ot::gdn::detail::conv::avx2
