// Size arithmetic that cannot overflow: checked_numel and the allocations built on it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ot/error.h"
#include "ot/output_pool.h"
#include "ot/tensor.h"

namespace test_sizes {
using namespace ot;

namespace {
// The ot::Error of `f`, or fails.
template <class F> Error error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no ot::Error";
  return Error("", "", "");
}
}  // namespace

TEST(Sizes, CheckedNumelAtTheLimit) {
  // 2^38 fp32 elements are exactly kMaxTensorBytes; one row more is over it.
  EXPECT_EQ(checked_numel("op", "arg", {int64_t(1) << 19, int64_t(1) << 19}, DType::f32), int64_t(1) << 38);
  Error e = error_of([] { checked_numel("my_op", "tokens", {(int64_t(1) << 19) + 1, int64_t(1) << 19}, DType::f32); });
  EXPECT_EQ(e.op(), "my_op");
  EXPECT_EQ(e.arg(), "tokens");
  EXPECT_NE(e.expected().find("2^40 bytes"), std::string::npos) << e.what();
  // The byte count, not the element count, is bounded: the same shape in bf16 fits.
  EXPECT_EQ(checked_numel("op", "arg", {(int64_t(1) << 19) + 1, int64_t(1) << 19}, DType::bf16), ((int64_t(1) << 19) + 1) << 19);
}

TEST(Sizes, CheckedNumelOverflow) {
  // Products that wrap int64 (and uint64) are errors, not small numbers.
  EXPECT_EQ(error_of([] { checked_numel("op", "T", {INT64_MAX, 2}, DType::u8); }).arg(), "T");
  EXPECT_EQ(error_of([] { checked_numel("op", "H", {int64_t(1) << 32, int64_t(1) << 32, 16}, DType::u8); }).arg(), "H");
  EXPECT_EQ(error_of([] { checked_numel("op", "E", {int64_t(1) << 62, 1}, DType::i64); }).arg(), "E");  // 2^65 bytes
  EXPECT_EQ(error_of([] { checked_numel("op", "E", {4, -1}, DType::f32); }).expected(), "non-negative sizes");
  // An empty dim makes the tensor empty whatever the others are.
  EXPECT_EQ(checked_numel("op", "arg", {0, INT64_MAX, INT64_MAX}, DType::f32), 0);
  EXPECT_EQ(checked_numel("op", "arg", {}, DType::f32), 1);
}

TEST(Sizes, AllocationsAreChecked) {
  // Tensor::empty / zeros and the output pool reject a size before allocating it.
  EXPECT_EQ(error_of([] { Tensor::empty(DType::f32, {int64_t(1) << 40, 4}); }).op(), "Tensor::empty");
  EXPECT_EQ(error_of([] { Tensor::zeros(DType::bf16, {INT64_MAX, INT64_MAX}); }).arg(), "shape");
  EXPECT_EQ(error_of([] { pooled_empty(DType::f32, {int64_t(1) << 62, 8}); }).op(), "pooled_empty");
  EXPECT_EQ(error_of([] { Tensor::empty(DType::f32, {3, -2}); }).expected(), "non-negative sizes");
  EXPECT_EQ(Tensor::empty(DType::f32, {0, int64_t(1) << 50}).numel(), 0);
}

}  // namespace test_sizes
