#pragma once
// Large operator outputs without a first-touch page fault per call: a small process-wide pool of
// earlier outputs whose storage nobody holds any more (a caching allocator). A buffer still
// referenced anywhere (a Tensor copy, a binding holding the storage) is never handed out again, so
// callers see ordinary fresh Tensors; the only rule is not to keep raw pointers past the Tensor.
#include <cstdint>
#include <vector>

#include "ot/tensor.h"

namespace ot {

// Tensor::empty for outputs (contents unspecified), reusing a large buffer of an earlier call of
// the same dtype and shape when nothing else holds it. Small outputs (< 256 KiB) are plain empty.
Tensor pooled_empty(DType dt, const std::vector<int64_t>& shape);
// Asks for transparent huge pages on the whole 2 MiB pages of a large fresh output.
void advise_huge_pages(const Tensor& t);

}  // namespace ot
