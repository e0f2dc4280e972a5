// quantize_weights / quantize_weights_with / dequantize_weights (ot/quant_weights.h): hand-worked
// codes, ties away from zero, clamping, the int4 nibble order, round-trip error bounds, constant
// and all-zero channels, and bad arguments rejected with the argument's name.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/quant_weights.h"

namespace test_quant_weights {
using namespace ot;

namespace {

Tensor f32(const std::vector<int64_t>& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(DType::f32, shape);
  for (size_t i = 0; i < v.size(); ++i) t.ptr<float>()[i] = v[i];
  return t;
}
Tensor random_w(const std::vector<int64_t>& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t = Tensor::empty(DType::f32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(rng);
  return t;
}
// The argument an ot::Error names, or "" when fn does not throw one.
template <class F> std::string error_arg(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.arg();
  }
  return "";
}
int code4(const Tensor& q, int64_t g, int64_t k, int64_t n, int64_t N) {
  unsigned b = q.ptr<uint8_t>()[(g * q.size(1) + k) * ((N + 1) / 2) + n / 2];
  unsigned nib = (b >> (4 * (n & 1))) & 0xF;
  return nib >= 8 ? int(nib) - 16 : int(nib);
}

}  // namespace

TEST(QuantWeights, Int8SymmetricHandWorked) {
  // Column 0: max |w| = 127 -> scale 1, codes exact; -63.5 is a tie and goes away from zero.
  // Column 1: max |w| = 2.54 -> scale 0.02; 1.0 / 0.02 = 50.
  Tensor w = f32({3, 2}, {127.f, 1.0f, -63.5f, -2.54f, 1.f, 0.f});
  QuantizedWeights q = quantize_weights(w, WeightFormat::int8, 0, true);
  ASSERT_EQ(q.data.dtype(), DType::i8);
  ASSERT_EQ(q.scale.shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(q.offset.defined());
  EXPECT_EQ(q.scale.ptr<float>()[0], 1.f);
  EXPECT_FLOAT_EQ(q.scale.ptr<float>()[1], 2.54f / 127.f);
  const int8_t* c = q.data.ptr<int8_t>();
  EXPECT_EQ(c[0], 127);
  EXPECT_EQ(c[2], -64);
  EXPECT_EQ(c[4], 1);
  EXPECT_EQ(c[1], 50);
  EXPECT_EQ(c[3], -127);
  EXPECT_EQ(c[5], 0);
}

TEST(QuantWeights, TiesAwayFromZeroAndClamp) {
  // Given scale 1 (offset 0): w / s lands exactly on .5 values and outside the range.
  Tensor w = f32({8, 1}, {2.5f, -2.5f, 0.5f, -0.5f, 1.49f, 200.f, -300.f, 127.5f});
  Tensor s = f32({1, 1}, {1.f});
  QuantizedWeights q = quantize_weights_with(w, s, {}, WeightFormat::int8, 0);
  const std::vector<int> want = {3, -3, 1, -1, 1, 127, -128, 127};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(q.data.ptr<int8_t>()[i], want[i]) << i;
  // int4: [-8, 7]; an offset shifts before rounding: round(w - o).
  Tensor w4 = f32({6, 1}, {9.f, -9.f, 6.5f, -7.5f, 1.f, 0.f});
  Tensor o = f32({1, 1}, {0.5f});
  QuantizedWeights q4 = quantize_weights_with(w4, s, o, WeightFormat::int4, 0);
  const std::vector<int> want4 = {7, -8, 6, -8, 1, -1};  // 8.5->7, -9.5->-8, 6, -8, 0.5->1, -0.5->-1
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(code4(q4.data, 0, k, 0, 1), want4[size_t(k)]) << k;
}

TEST(QuantWeights, Int4NibbleOrderAndOddN) {
  // N = 3: byte 0 holds columns 0 (low) and 1 (high), byte 1 column 2 and a zero high nibble.
  Tensor w = f32({1, 3}, {-8.f, 7.f, -1.f});
  Tensor s = f32({1, 3}, {1.f, 1.f, 1.f});
  QuantizedWeights q = quantize_weights_with(w, s, {}, WeightFormat::int4, 0);
  ASSERT_EQ(q.data.dtype(), DType::u8);
  ASSERT_EQ(q.data.shape(), (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(q.data.ptr<uint8_t>()[0], 0x78);
  EXPECT_EQ(q.data.ptr<uint8_t>()[1], 0x0F);
}

TEST(QuantWeights, AsymmetricHandWorked) {
  // int4 column [0, 15]: scale (15 - 0) / 15 = 1, offset 0 / 1 - (-8) = 8, codes -8 .. 7.
  Tensor w = f32({4, 1}, {0.f, 15.f, 7.f, 8.f});
  QuantizedWeights q = quantize_weights(w, WeightFormat::int4, 0, false);
  EXPECT_EQ(q.scale.ptr<float>()[0], 1.f);
  EXPECT_EQ(q.offset.ptr<float>()[0], 8.f);
  EXPECT_EQ(code4(q.data, 0, 0, 0, 1), -8);
  EXPECT_EQ(code4(q.data, 0, 1, 0, 1), 7);
  EXPECT_EQ(code4(q.data, 0, 2, 0, 1), -1);
  EXPECT_EQ(code4(q.data, 0, 3, 0, 1), 0);
  Tensor d = dequantize_weights(q.view());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d.ptr<float>()[i], w.ptr<float>()[i]);
}

TEST(QuantWeights, ZeroAndConstantChannels) {
  // Column 0 all zero, column 1 constant 0.75, column 2 varies; per-channel, both symmetries.
  Tensor w = f32({2, 3}, {0.f, 0.75f, 1.f, 0.f, 0.75f, -1.f});
  for (WeightFormat f : {WeightFormat::int8, WeightFormat::int4}) {
    for (bool sym : {true, false}) {
      QuantizedWeights q = quantize_weights(w, f, 0, sym);
      Tensor d = dequantize_weights(q.view());
      if (sym) { EXPECT_EQ(q.scale.ptr<float>()[0], 0.f); }
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(d.ptr<float>()[k * 3 + 0], 0.f) << weight_format_name(f) << sym;
        EXPECT_NEAR(d.ptr<float>()[k * 3 + 1], 0.75f, 1e-6) << weight_format_name(f) << sym;
      }
    }
  }
}

TEST(QuantWeights, RoundTripWithinHalfAStep) {
  const int64_t G = 3, K = 128, N = 37;
  Tensor w = random_w({G, K, N}, 5, -0.7f, 1.3f);
  for (WeightFormat f : {WeightFormat::int8, WeightFormat::int4})
    for (int64_t gs : {0, 32, 64, 128})
      for (bool sym : {true, false}) {
        QuantizedWeights q = quantize_weights(w, f, gs, sym);
        Tensor d = dequantize_weights(q.view());
        const int64_t groups = gs ? K / gs : 1, len = gs ? gs : K;
        double worst = 0;
        for (int64_t g = 0; g < G; ++g)
          for (int64_t k = 0; k < K; ++k)
            for (int64_t n = 0; n < N; ++n) {
              const float s = q.scale.ptr<float>()[(g * groups + k / len) * N + n];
              const float e = std::fabs(d.ptr<float>()[(g * K + k) * N + n] - w.ptr<float>()[(g * K + k) * N + n]);
              worst = std::max(worst, double(e / s));
            }
        // Half a quantisation step, plus fp32 rounding of w / s and of the dequantisation.
        EXPECT_LE(worst, 0.5 + 1e-3) << weight_format_name(f) << " gs=" << gs << " sym=" << sym;
        EXPECT_GT(worst, 0.4) << "the bound is tight, so a looser quantiser fails it";
      }
}

TEST(QuantWeights, Bf16InputAndTwoDimensions) {
  Tensor w = random_w({64, 5}, 9);
  Tensor wb = Tensor::empty(DType::bf16, {64, 5});
  copy_into(w, wb);
  QuantizedWeights a = quantize_weights(wb, WeightFormat::int4, 32, false);
  ASSERT_EQ(a.data.shape(), (std::vector<int64_t>{1, 64, 3}));
  ASSERT_EQ(a.scale.shape(), (std::vector<int64_t>{1, 2, 5}));
  ASSERT_EQ(a.offset.shape(), (std::vector<int64_t>{1, 2, 5}));
  Tensor wf = Tensor::empty(DType::f32, {64, 5});
  copy_into(wb, wf);
  QuantizedWeights b = quantize_weights(wf, WeightFormat::int4, 32, false);
  for (int64_t i = 0; i < a.data.numel(); ++i) EXPECT_EQ(a.data.ptr<uint8_t>()[i], b.data.ptr<uint8_t>()[i]);
}

TEST(QuantWeights, BadArgumentsNameTheArgument) {
  Tensor w = random_w({2, 48, 4}, 1);
  EXPECT_EQ(error_arg([&] { quantize_weights(w, WeightFormat::int4, 32, true); }), "group_size");  // 48 % 32
  EXPECT_EQ(error_arg([&] { quantize_weights(w, WeightFormat::int4, 16, true); }), "group_size");
  EXPECT_EQ(error_arg([&] { quantize_weights(Tensor::zeros(DType::i32, {2, 4}), WeightFormat::int8, 0, true); }), "w");
  EXPECT_EQ(error_arg([&] { quantize_weights(Tensor::zeros(DType::f32, {4}), WeightFormat::int8, 0, true); }), "w");
  Tensor bad = Tensor::copy_of(w);
  bad.ptr<float>()[7] = NAN;
  EXPECT_EQ(error_arg([&] { quantize_weights(bad, WeightFormat::int8, 0, true); }), "w");
  EXPECT_EQ(error_arg([&] { quantize_weights(w, WeightFormat(7), 0, true); }), "format");
  EXPECT_EQ(error_arg([&] { quantize_weights_with(w, f32({2, 3}, {1, 1, 1, 1, 1, 1}), {}, WeightFormat::int8, 0); }), "antiquant_scale");

  QuantizedWeights q8 = quantize_weights(w, WeightFormat::int8, 0, false);
  QuantWeightView v = q8.view();
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", v); }), "");
  QuantWeightView as4 = v;
  as4.format = WeightFormat::int4;  // i8 data under the int4 format
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", as4); }), "weight");
  Tensor s3 = Tensor::zeros(DType::f32, {2, 1, 4});
  QuantWeightView wrong_scale = v;
  wrong_scale.scale = s3;  // [G, groups, N] for a per-channel format
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", wrong_scale); }), "antiquant_scale");
  QuantWeightView int_scale = v;
  int_scale.scale = Tensor::zeros(DType::i32, {2, 4});
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", int_scale); }), "antiquant_scale");
  Tensor nan_scale = Tensor::copy_of(q8.scale);
  nan_scale.ptr<float>()[3] = INFINITY;
  QuantWeightView inf_scale = v;
  inf_scale.scale = nan_scale;
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", inf_scale); }), "antiquant_scale");
  QuantWeightView bad_off = v;
  bad_off.offset = Tensor::zeros(DType::f32, {2, 5});
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", bad_off); }), "antiquant_offset");
  QuantWeightView bad_gs = v;
  bad_gs.group_size = 48;
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", bad_gs); }), "antiquant_group_size");

  QuantizedWeights q4 = quantize_weights(random_w({2, 64, 5}, 2), WeightFormat::int4, 64, true);
  QuantWeightView v4 = q4.view();
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", v4); }), "");
  v4.data = Tensor::zeros(DType::u8, {2, 64, 2});  // packed width 2 for N = 5 (needs 3)
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", v4); }), "weight");
  QuantWeightView v4b = q4.view();
  v4b.group_size = 32;  // the scale has K / 64 groups
  EXPECT_EQ(error_arg([&] { quant_weight_shape("op", v4b); }), "antiquant_scale");
}

}  // namespace test_quant_weights
