// Element access by multi-index for the GDN layer references (any dtype, any strides), in fp64.
#pragma once
#include <cmath>
#include <initializer_list>

#include "ot/tensor.h"

namespace ot::gdn::ref {

inline double rd(const TensorView& v, std::initializer_list<int64_t> idx) {
  TensorView e(static_cast<char*>(v.data) + v.offset(idx) * int64_t(dtype_size(v.dtype)), v.dtype, {1});
  return get_as_double(e, 0);
}
inline void wr(const TensorView& v, std::initializer_list<int64_t> idx, double x) {
  TensorView e(static_cast<char*>(v.data) + v.offset(idx) * int64_t(dtype_size(v.dtype)), v.dtype, {1});
  set_from_double(e, 0, x);
}
inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace ot::gdn::ref
