// A tensor as [rows, N] rows (the row-wise operators: the norms): a view when its leading dims
// collapse into one row stride with the last dim contiguous, else a contiguous copy; and a [N]
// parameter vector widened to fp32 once per call.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/numeric.h"
#include "ot/tensor.h"
#include "src/core/elem_at.h"

namespace ot::detail {

// v as [rows, N] with rows one stride apart and N contiguous (the copy, when one is needed, is
// kept in `keep`).
inline TensorView as_rows(const TensorView& v, int64_t rows, int64_t N, Tensor& keep) {
  bool ok = v.last_dim_contiguous();
  int64_t st = N, expect = -1;  // expect: the stride the next outer non-unit dim must have
  for (int i = v.ndim - 2; i >= 0 && ok; --i) {
    if (v.sizes[i] == 1) continue;
    if (expect < 0) st = v.strides[i];
    else ok = v.strides[i] == expect;
    expect = v.strides[i] * v.sizes[i];
  }
  if (!ok) {
    keep = Tensor::copy_of(v);
    return TensorView(keep.view().data, v.dtype, {rows, N});
  }
  return TensorView(v.data, v.dtype, {rows, N}, {st, 1});
}

// A 1-D float view's values in fp32.
inline std::vector<float> vector_f32(const TensorView& w) {
  std::vector<float> v(size_t(w.sizes[0]));
  if (w.strides[0] == 1) convert_to_f32(w.data, w.dtype, v.data(), w.sizes[0]);  // vector widening: per element it was 1/3 of a decode call
  else
    for (int64_t i = 0; i < w.sizes[0]; ++i) v[size_t(i)] = float(get_as_double(w, i));
  return v;
}

// A [rows, N] view's rows as the row kernels take them (row stride = strides[0]).
inline StridedRows rows_in(const TensorView& v) { return {v.data, v.dtype, v.strides[0]}; }
inline StridedOutRows rows_out(const TensorView& v) { return {v.data, v.dtype, v.strides[0]}; }
// A contiguous tensor as [rows, N].
inline TensorView rows_view(const Tensor& t, int64_t rows, int64_t N) { return TensorView(t.view().data, t.dtype(), {rows, N}); }

// The product of all dims but the last.
inline int64_t leading_rows(const TensorView& v) {
  int64_t r = 1;
  for (int i = 0; i + 1 < v.ndim; ++i) r *= v.sizes[i];
  return r;
}

}  // namespace ot::detail
