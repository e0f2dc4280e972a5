// Tensors: a non-owning view (the only currency between layers) and a small owning tensor
// that operators return when an output's size depends on the data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace ot {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, i8 };  // u8 doubles as bool

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool is_float(DType t);

inline constexpr int kMaxDims = 6;

// The largest tensor the library allocates (1 TiB). A size whose element count overflows int64 or
// whose bytes exceed it is rejected with an ot::Error before anything is allocated.
inline constexpr uint64_t kMaxTensorBytes = uint64_t(1) << 40;
// Elements of `shape` in dtype t; an ot::Error naming op and arg when a dim is negative or the
// tensor would exceed kMaxTensorBytes.
int64_t checked_numel(const char* op, const char* arg, const std::vector<int64_t>& shape, DType t);

// Non-owning view: data pointer, dtype, sizes and strides in elements (not bytes).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* d, DType t, std::initializer_list<int64_t> shape);
  TensorView(void* d, DType t, const std::vector<int64_t>& shape);
  // Explicit strides (elements).
  TensorView(void* d, DType t, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

  bool defined() const { return data != nullptr || ndim > 0; }
  int64_t size(int i) const { return sizes[i < 0 ? i + ndim : i]; }
  int64_t stride(int i) const { return strides[i < 0 ? i + ndim : i]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool last_dim_contiguous() const { return ndim == 0 || strides[ndim - 1] == 1 || sizes[ndim - 1] <= 1; }
  std::vector<int64_t> shape() const { return {sizes, sizes + ndim}; }
  std::string shape_str() const;  // "[4, 128] bf16"

  template <class T> T* ptr() const { return static_cast<T*>(data); }
  // Element offset of a multi-index (no bounds check).
  int64_t offset(std::initializer_list<int64_t> idx) const;
  // Sub-view selecting index i along dim (drops that dim).
  TensorView select(int dim, int64_t i) const;
  // Sub-view of rows [begin, end) along dim.
  TensorView narrow(int dim, int64_t begin, int64_t len) const;
  // Same memory, new contiguous shape (requires is_contiguous()).
  TensorView reshape(const std::vector<int64_t>& shape) const;
};

// Owning tensor: 64-byte-aligned storage shared by copies (copying a Tensor does not copy data).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType t, const std::vector<int64_t>& shape);
  static Tensor zeros(DType t, const std::vector<int64_t>& shape);
  // Deep copy of any view into a contiguous tensor.
  static Tensor copy_of(const TensorView& v);
  // A tensor over existing storage (view.data must lie inside it): lets an owner of reusable
  // buffers hand out outputs without a fresh allocation.
  static Tensor from_storage(std::shared_ptr<void> storage, const TensorView& view);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  bool defined() const { return storage_ != nullptr || view_.ndim > 0; }
  template <class T> T* ptr() const { return view_.ptr<T>(); }
  int64_t numel() const { return view_.numel(); }
  int64_t size(int i) const { return view_.size(i); }
  DType dtype() const { return view_.dtype; }
  std::vector<int64_t> shape() const { return view_.shape(); }
  // The storage, so a binding can keep it alive after wrapping the data.
  std::shared_ptr<void> storage() const { return storage_; }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copy between views of equal shape, converting dtype (float types only, or identical dtypes).
void copy_into(const TensorView& src, const TensorView& dst);
// Read element i (flat, row-major over the view's shape) as double; for tests and references.
double get_as_double(const TensorView& v, int64_t flat_index);
void set_from_double(const TensorView& v, int64_t flat_index, double x);

}  // namespace ot
