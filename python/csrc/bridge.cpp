#include "bridge.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

namespace ot::py {

ot::DType to_ot(c10::ScalarType t, const char* op, const char* arg) {
  switch (t) {
    case c10::ScalarType::Float: return ot::DType::f32;
    case c10::ScalarType::BFloat16: return ot::DType::bf16;
    case c10::ScalarType::Half: return ot::DType::f16;
    case c10::ScalarType::Int: return ot::DType::i32;
    case c10::ScalarType::Long: return ot::DType::i64;
    case c10::ScalarType::Char: return ot::DType::i8;
    case c10::ScalarType::Byte:
    case c10::ScalarType::Bool: return ot::DType::u8;
    default: break;
  }
  throw ot::Error(op, arg, "dtype float32, bfloat16, float16, int32, int64, int8, uint8 or bool", c10::toString(t));
}

c10::ScalarType to_torch(ot::DType t) {
  switch (t) {
    case ot::DType::f32: return c10::ScalarType::Float;
    case ot::DType::bf16: return c10::ScalarType::BFloat16;
    case ot::DType::f16: return c10::ScalarType::Half;
    case ot::DType::i32: return c10::ScalarType::Int;
    case ot::DType::i64: return c10::ScalarType::Long;
    case ot::DType::u8: return c10::ScalarType::Byte;
    case ot::DType::i8: return c10::ScalarType::Char;  // int8: quantised expanded_x (init routing, EP dispatch)
  }
  return c10::ScalarType::Undefined;
}

ot::TensorView view(const at::Tensor& t, const char* op, const char* arg) {
  OT_CHECK(t.defined(), op, arg, "a tensor", "None");
  OT_CHECK(t.device().is_cpu(), op, arg, "a CPU tensor", t.device().str());
  OT_CHECK(t.layout() == c10::kStrided, op, arg, "a dense (strided) tensor", "a sparse tensor");
  OT_CHECK(t.dim() <= ot::kMaxDims, op, arg, "at most 6 dims", t.dim());
  ot::TensorView v;
  v.dtype = to_ot(t.scalar_type(), op, arg);
  v.data = t.data_ptr();
  v.ndim = int(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.sizes[i] = t.sizes()[i];
    v.strides[i] = t.strides()[i];
  }
  return v;
}

ot::TensorView view(const c10::optional<at::Tensor>& t, const char* op, const char* arg) {
  if (!t.has_value() || !t->defined()) return {};
  return view(*t, op, arg);
}

at::Tensor wrap(const ot::Tensor& t) {
  if (!t.defined()) return at::Tensor();
  const ot::TensorView& v = t.view();
  std::vector<int64_t> sizes(v.sizes, v.sizes + v.ndim), strides(v.strides, v.strides + v.ndim);
  auto opts = at::TensorOptions().dtype(to_torch(v.dtype)).device(c10::kCPU);
  if (v.data == nullptr) return at::empty(sizes, opts);  // zero elements: nothing to share
  std::shared_ptr<void> keep = t.storage();
  return at::from_blob(v.data, sizes, strides, [keep](void*) mutable { keep.reset(); }, opts);
}

c10::optional<at::Tensor> wrap_opt(const ot::Tensor& t) {
  if (!t.defined()) return c10::nullopt;
  return wrap(t);
}

at::Tensor empty(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  return at::empty(shape, at::TensorOptions().dtype(dtype).device(c10::kCPU));
}

void rethrow(const ot::Error& e) { TORCH_CHECK(false, e.what()); }

}  // namespace ot::py
