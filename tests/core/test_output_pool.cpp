// The output pool (ot/output_pool.h): a released output's buffer is handed out again for the same
// dtype and shape; a buffer anyone still holds never is; small outputs are not pooled at all.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ot/moe.h"
#include "ot/output_pool.h"
#include "ot/tensor.h"

namespace test_output_pool {
using namespace ot;

namespace {
const void* data_of(const Tensor& t) { return t.view().data; }
}  // namespace

TEST(OutputPool, HandsOutAReleasedBufferAgainButNeverAHeldOne) {
  const std::vector<int64_t> shape{128, 1024};  // 512 KiB of fp32: pooled
  Tensor a = pooled_empty(DType::f32, shape);
  const void* pa = data_of(a);
  Tensor b = pooled_empty(DType::f32, shape);  // a is held: a different buffer
  EXPECT_NE(data_of(b), pa);
  Tensor held_copy = a;
  a = Tensor();
  Tensor c = pooled_empty(DType::f32, shape);  // a's storage is still held through the copy
  EXPECT_NE(data_of(c), pa);
  EXPECT_NE(data_of(c), data_of(b));
  held_copy = Tensor();
  Tensor d = pooled_empty(DType::f32, shape);  // now nobody holds it
  EXPECT_EQ(data_of(d), pa);
  Tensor e = pooled_empty(DType::bf16, shape);  // another dtype never takes it
  EXPECT_NE(data_of(e), pa);
}

TEST(OutputPool, SmallOutputsAreFreshTensors) {
  Tensor a = pooled_empty(DType::f32, {16, 16});
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(a.dtype(), DType::f32);
}

// grouped_matmul's output comes from the pool: a result the caller still holds is never
// overwritten by the next call's.
TEST(OutputPool, GroupedMatmulKeepsAHeldResult) {
  const int64_t G = 2, M = 256, K = 32, N = 512;  // [M, N] fp32 = 512 KiB: pooled
  Tensor x = Tensor::empty(DType::f32, {M, K}), w = Tensor::empty(DType::f32, {G, K, N});
  Tensor gl = Tensor::empty(DType::i64, {G});
  for (int64_t i = 0; i < M * K; ++i) x.ptr<float>()[i] = float(i % 7) - 3.0f;
  for (int64_t i = 0; i < G * K * N; ++i) w.ptr<float>()[i] = float(i % 5) - 2.0f;
  gl.ptr<int64_t>()[0] = M / 2;
  gl.ptr<int64_t>()[1] = M / 2;
  Tensor y1 = moe::grouped_matmul(x.view(), w.view(), gl.view(), moe::GroupListType::count);
  const std::vector<float> first(y1.ptr<float>(), y1.ptr<float>() + M * N);
  for (int64_t i = 0; i < M * K; ++i) x.ptr<float>()[i] = -x.ptr<float>()[i];
  Tensor y2 = moe::grouped_matmul(x.view(), w.view(), gl.view(), moe::GroupListType::count);
  EXPECT_NE(data_of(y1), data_of(y2));
  int64_t changed = 0, negated = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    changed += y1.ptr<float>()[i] != first[size_t(i)];
    negated += y2.ptr<float>()[i] == -first[size_t(i)];
  }
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(negated, M * N);
  const void* p2 = data_of(y2);
  y2 = Tensor();
  Tensor y3 = moe::grouped_matmul(x.view(), w.view(), gl.view(), moe::GroupListType::count);
  EXPECT_EQ(data_of(y3), p2);  // the released output is reused: no fresh pages a call
}

}  // namespace test_output_pool
