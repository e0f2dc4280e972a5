#include "ot/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/workspace.h"

namespace ot {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::i64: return 8;
    case DType::u8: case DType::i8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
  }
  return "?";
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

int64_t checked_numel(const char* op, const char* arg, const std::vector<int64_t>& shape, DType t) {
  uint64_t n = 1;
  bool over = false;
  for (int64_t d : shape) {
    OT_CHECK(d >= 0, op, arg, "non-negative sizes", "a size of ", d);
    over |= __builtin_mul_overflow(n, uint64_t(d), &n);
  }
  uint64_t bytes = 0;
  over |= __builtin_mul_overflow(n, uint64_t(dtype_size(t)), &bytes);
  if (over || bytes > kMaxTensorBytes) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
    s << "] " << dtype_name(t);
    throw Error(op, arg, "a tensor of at most 2^40 bytes (kMaxTensorBytes)", s.str());
  }
  return int64_t(n);
}

static void set_contiguous(TensorView& v) {
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) { v.strides[i] = s; s *= v.sizes[i]; }
}

TensorView::TensorView(void* d, DType t, std::initializer_list<int64_t> shape)
    : TensorView(d, t, std::vector<int64_t>(shape)) {}

TensorView::TensorView(void* d, DType t, const std::vector<int64_t>& shape) : data(d), dtype(t) {
  OT_CHECK(shape.size() <= size_t(kMaxDims), "TensorView", "shape", "at most 6 dims", shape.size());
  ndim = int(shape.size());
  for (int i = 0; i < ndim; ++i) sizes[i] = shape[i];
  set_contiguous(*this);
}

TensorView::TensorView(void* d, DType t, const std::vector<int64_t>& shape, const std::vector<int64_t>& st)
    : TensorView(d, t, shape) {
  OT_CHECK(st.size() == shape.size(), "TensorView", "strides", "one stride per dim", st.size());
  for (int i = 0; i < ndim; ++i) strides[i] = st[i];
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (sizes[i] != 1 && strides[i] != s) return false;
    s *= sizes[i];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::ostringstream o;
  o << "[";
  for (int i = 0; i < ndim; ++i) o << (i ? ", " : "") << sizes[i];
  o << "] " << dtype_name(dtype);
  return o.str();
}

int64_t TensorView::offset(std::initializer_list<int64_t> idx) const {
  int64_t off = 0;
  int i = 0;
  for (int64_t x : idx) off += x * strides[i++];
  return off;
}

TensorView TensorView::select(int dim, int64_t i) const {
  TensorView r = *this;
  r.data = static_cast<char*>(data) + i * strides[dim] * int64_t(dtype_size(dtype));
  for (int d = dim; d < ndim - 1; ++d) { r.sizes[d] = sizes[d + 1]; r.strides[d] = strides[d + 1]; }
  r.ndim = ndim - 1;
  return r;
}

TensorView TensorView::narrow(int dim, int64_t begin, int64_t len) const {
  TensorView r = *this;
  r.data = static_cast<char*>(data) + begin * strides[dim] * int64_t(dtype_size(dtype));
  r.sizes[dim] = len;
  return r;
}

TensorView TensorView::reshape(const std::vector<int64_t>& shape) const {
  OT_CHECK(is_contiguous(), "reshape", "self", "a contiguous view", shape_str());
  TensorView r(data, dtype, shape);
  OT_CHECK(r.numel() == numel(), "reshape", "shape", "the same number of elements", r.numel(), " vs ", numel());
  return r;
}

Tensor Tensor::empty(DType t, const std::vector<int64_t>& shape) {
  checked_numel("Tensor::empty", "shape", shape, t);  // the last line of defence: operators check their sizes first
  Tensor r;
  TensorView v(nullptr, t, shape);
  size_t bytes = v.nbytes();
  r.storage_ = std::shared_ptr<void>(aligned_alloc64(bytes ? bytes : 1), aligned_free);
  v.data = r.storage_.get();
  r.view_ = v;
  return r;
}

Tensor Tensor::zeros(DType t, const std::vector<int64_t>& shape) {
  Tensor r = empty(t, shape);
  std::memset(r.view_.data, 0, r.view_.nbytes());
  return r;
}

Tensor Tensor::from_storage(std::shared_ptr<void> storage, const TensorView& view) {
  Tensor r;
  r.storage_ = std::move(storage);
  r.view_ = view;
  return r;
}

Tensor Tensor::copy_of(const TensorView& v) {
  Tensor r = empty(v.dtype, v.shape());
  copy_into(v, r.view());
  return r;
}

// Walks every element of `v` in row-major order, calling fn(flat, element_offset).
template <class F> static void for_each_offset(const TensorView& v, F fn) {
  int64_t n = v.numel();
  if (n == 0) return;
  int64_t idx[kMaxDims] = {};
  int64_t off = 0;
  for (int64_t flat = 0; flat < n; ++flat) {
    fn(flat, off);
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[d] < v.sizes[d]) { off += v.strides[d]; break; }
      off -= (v.sizes[d] - 1) * v.strides[d];
      idx[d] = 0;
    }
  }
}

static double load(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::i32: return static_cast<const int32_t*>(base)[off];
    case DType::i64: return double(static_cast<const int64_t*>(base)[off]);
    case DType::u8: return static_cast<const uint8_t*>(base)[off];
    case DType::i8: return static_cast<const int8_t*>(base)[off];
  }
  return 0;
}

static void store(void* base, DType t, int64_t off, double x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[off] = float(x); break;
    case DType::bf16: static_cast<uint16_t*>(base)[off] = f32_to_bf16(float(x)); break;
    case DType::f16: static_cast<uint16_t*>(base)[off] = f32_to_f16(float(x)); break;
    case DType::i32: static_cast<int32_t*>(base)[off] = int32_t(x); break;
    case DType::i64: static_cast<int64_t*>(base)[off] = int64_t(x); break;
    case DType::u8: static_cast<uint8_t*>(base)[off] = uint8_t(x); break;
    case DType::i8: static_cast<int8_t*>(base)[off] = int8_t(x); break;
  }
}

static int64_t offset_of_flat(const TensorView& v, int64_t flat) {
  // Most views are contiguous: the check costs less than the divisions (the references read every
  // element through here).
  if (v.is_contiguous()) return flat;
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    off += (flat % v.sizes[d]) * v.strides[d];
    flat /= v.sizes[d];
  }
  return off;
}

double get_as_double(const TensorView& v, int64_t flat) { return load(v.data, v.dtype, offset_of_flat(v, flat)); }
void set_from_double(const TensorView& v, int64_t flat, double x) { store(v.data, v.dtype, offset_of_flat(v, flat), x); }

// n elements of one row into another: same dtype a memcpy, float to float through the vector
// conversions (exact widening, one round-to-nearest-even narrowing: the element loop's bits).
static void copy_row(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, size_t(n) * dtype_size(st));
  } else if (dt == DType::f32) {
    convert_to_f32(src, st, static_cast<float*>(dst), n);
  } else if (st == DType::f32) {
    convert_from_f32(static_cast<const float*>(src), dst, dt, n);
  } else {  // bf16 <-> f16
    float buf[512];
    for (int64_t i = 0; i < n; i += 512) {
      const int64_t m = std::min<int64_t>(512, n - i);
      convert_to_f32(static_cast<const char*>(src) + size_t(i) * dtype_size(st), st, buf, m);
      convert_from_f32(buf, static_cast<char*>(dst) + size_t(i) * dtype_size(dt), dt, m);
    }
  }
}

// Element offset of row r (flat index over all dims but the last) of v.
static int64_t row_offset(const TensorView& v, int64_t r) {
  int64_t off = 0;
  for (int d = v.ndim - 2; d >= 0; --d) {
    off += (r % v.sizes[d]) * v.strides[d];
    r /= v.sizes[d];
  }
  return off;
}

// Rows os[k] / od[k] (k < nr) of n elements, stepped by ss / ds, in tiles of 16 rows x 16
// elements: where the source is transposed (its rows adjacent, its elements a row apart), a
// tile reads 16 whole lines and writes 16, instead of a line per element read.
template <class T> static void copy_tiles(const void* src, const int64_t* os, int64_t ss, void* dst, const int64_t* od, int64_t ds, int nr, int64_t n) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t j1 = std::min(n, j0 + 16);
    for (int k = 0; k < nr; ++k)
      for (int64_t j = j0; j < j1; ++j) d[od[k] + j * ds] = s[os[k] + j * ss];
  }
}

// src and dst of one shape, a last dim of any stride on either side (a transposed view, say): 16
// rows of the last dim at a time, each row's start found once and its elements stepped by their
// strides in 16 x 16 tiles (the element walk found every destination offset by divisions: ~25 ns
// an element), on all threads when there is enough of them. Float dtypes convert through the
// element loop's rounding.
static void copy_strided_rows(const TensorView& src, const TensorView& dst) {
  const int64_t n = src.sizes[src.ndim - 1], rows = n == 0 ? 0 : src.numel() / n;
  const int64_t ss = src.strides[src.ndim - 1], ds = dst.strides[dst.ndim - 1];
  const int64_t blocks = (rows + 15) / 16;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t os[16], od[16];
      const int nr = int(std::min<int64_t>(16, rows - b * 16));
      for (int k = 0; k < nr; ++k) os[k] = row_offset(src, b * 16 + k), od[k] = row_offset(dst, b * 16 + k);
      if (src.dtype != dst.dtype) {
        for (int k = 0; k < nr; ++k)
          for (int64_t j = 0; j < n; ++j) store(dst.data, dst.dtype, od[k] + j * ds, load(src.data, src.dtype, os[k] + j * ss));
        continue;
      }
      switch (dtype_size(src.dtype)) {
        case 1: copy_tiles<uint8_t>(src.data, os, ss, dst.data, od, ds, nr, n); break;
        case 2: copy_tiles<uint16_t>(src.data, os, ss, dst.data, od, ds, nr, n); break;
        case 4: copy_tiles<uint32_t>(src.data, os, ss, dst.data, od, ds, nr, n); break;
        default: copy_tiles<uint64_t>(src.data, os, ss, dst.data, od, ds, nr, n); break;
      }
    }
  };
  if (src.numel() >= (int64_t(1) << 16)) parallel_for(blocks, run);
  else run(0, blocks);
}

void copy_into(const TensorView& src, const TensorView& dst) {
  OT_CHECK(src.numel() == dst.numel(), "copy_into", "dst", "as many elements as src", dst.shape_str(), " vs ", src.shape_str());
  bool ok = src.dtype == dst.dtype || (is_float(src.dtype) && is_float(dst.dtype));
  OT_CHECK(ok, "copy_into", "dst", "the same dtype, or float to float", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype));
  const int64_t n = src.numel();
  if (n == 0) return;
  const size_t ss = dtype_size(src.dtype), ds = dtype_size(dst.dtype);
  // Rows of unit stride (the whole tensor when both are contiguous, else the last dimension of two
  // views of one shape) copy as rows, on all threads when there is enough of them; other views of
  // one shape by strided tiles (copy_strided_rows); a copy between shapes walks the elements.
  int64_t row = 0;
  if (src.is_contiguous() && dst.is_contiguous()) row = std::min<int64_t>(n, 16384);
  else if (src.shape() == dst.shape() && src.strides[src.ndim - 1] == 1 && dst.strides[dst.ndim - 1] == 1) row = src.sizes[src.ndim - 1];
  if (row > 0) {
    const int64_t rows = (n + row - 1) / row;
    auto run = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t flat = r * row, m = std::min(row, n - flat);
        copy_row(static_cast<const char*>(src.data) + size_t(offset_of_flat(src, flat)) * ss, src.dtype,
                 static_cast<char*>(dst.data) + size_t(offset_of_flat(dst, flat)) * ds, dst.dtype, m);
      }
    };
    if (n >= (int64_t(1) << 16)) parallel_for(rows, run);
    else run(0, rows);
    return;
  }
  if (src.ndim > 0 && src.shape() == dst.shape()) {
    copy_strided_rows(src, dst);
    return;
  }
  if (src.dtype == dst.dtype && (src.dtype == DType::i64 || src.dtype == DType::i32)) {
    for_each_offset(src, [&](int64_t flat, int64_t off) {
      std::memcpy(static_cast<char*>(dst.data) + offset_of_flat(dst, flat) * ss, static_cast<const char*>(src.data) + off * ss, ss);
    });
    return;
  }
  for_each_offset(src, [&](int64_t flat, int64_t off) { store(dst.data, dst.dtype, offset_of_flat(dst, flat), load(src.data, src.dtype, off)); });
}

}  // namespace ot
