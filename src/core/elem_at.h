// Byte addresses of elements and rows: the one spelling of "p + elements * dtype_size(t)", for
// kernels that hold raw pointers and leading dimensions and for row access through views.
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot {

// Element `off` (counted in elements of dtype t) of the buffer at p.
inline const char* elem_at(const void* p, DType t, int64_t off) { return static_cast<const char*>(p) + off * int64_t(dtype_size(t)); }
inline char* elem_at(void* p, DType t, int64_t off) { return static_cast<char*>(p) + off * int64_t(dtype_size(t)); }
// Row r of a row-major buffer whose rows are ld elements apart.
inline const char* row_at(const void* p, DType t, int64_t ld, int64_t r) { return elem_at(p, t, r * ld); }
inline char* row_at(void* p, DType t, int64_t ld, int64_t r) { return elem_at(p, t, r * ld); }
// Row r of a view: rows ld elements apart, or stride(0) apart (its data pointer is not const:
// neither are these).
inline char* row_at(const TensorView& v, int64_t ld, int64_t r) { return elem_at(v.data, v.dtype, r * ld); }
inline char* row_at(const TensorView& v, int64_t r) { return elem_at(v.data, v.dtype, r * v.stride(0)); }

// Rows of one dtype, row t at p + t * st elements: how the per-row kernels take inputs and outputs.
struct StridedRows {
  const void* p = nullptr;
  DType dt = DType::f32;
  int64_t st = 0;
};
struct StridedOutRows {
  void* p = nullptr;
  DType dt = DType::f32;
  int64_t st = 0;
};

}  // namespace ot
