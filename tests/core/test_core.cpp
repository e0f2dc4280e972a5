#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/tensor.h"
#include "ot/trace.h"
#include "ot/workspace.h"

namespace test_core {
using namespace ot;

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is half-way between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(Numeric, Fp16RoundTripAndRounding) {
  for (float x : {0.f, 1.f, -1.f, 0.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f, 1234.f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  }
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(1234.5f), f32_to_f16(1234.f));  // tie between 1234 and 1235 -> even
  EXPECT_EQ(f32_to_f16(70000.f), 0x7c00);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e9f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  // Exhaustive: every finite fp16 survives fp16 -> fp32 -> fp16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
}

TEST(Numeric, AccumulateMatchesScalarAtEveryLengthAndIsa) {
  // acc += w * src for f32/bf16/f16 rows; lengths straddle the 8- and 16-lane vectors and their tails.
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 2048}) {
        std::vector<float> x(size_t(n) + 1), acc(size_t(n) + 1, 0.5f);
        for (int64_t i = 0; i <= n; ++i) x[size_t(i)] = round_to(t, 0.25f * float(i % 13) - 1.f);
        std::vector<uint16_t> h(size_t(n) + 1);
        if (t != DType::f32) convert_from_f32(x.data(), h.data(), t, n + 1);
        const void* src = t == DType::f32 ? static_cast<const void*>(x.data()) : h.data();
        accumulate_f32(src, t, 3.f, acc.data(), n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(acc[size_t(i)], 0.5f + 3.f * x[size_t(i)]) << n << " " << i;
        EXPECT_EQ(acc[size_t(n)], 0.5f) << "wrote past n = " << n;
      }
  }
}

TEST(Numeric, BulkConversionsBitIdenticalToScalarAtEveryIsa) {
  // Values that exercise rounding: bf16/fp16 ties (to even), fp16 subnormals and overflow, +-0,
  // +-Inf, NaN, plus a spread of ordinary values; lengths straddle the 8- and 16-lane vectors.
  std::vector<float> vals = {0.f, -0.f, 1.f, -1.5f, 65504.f, 65520.f, 1e9f, -1e9f, 6.0e-8f, 3.0e-5f, 1e-40f,
                             INFINITY, -INFINITY, NAN, 1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                             1.0f + std::ldexp(1.0f, -11), 1234.5f};
  for (int i = 0; i < 64; ++i) vals.push_back(std::ldexp(1.0f + 0.0371f * float(i), (i % 40) - 20) * (i % 3 ? 1.f : -1.f));
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), int64_t(16), int64_t(17), int64_t(31), int64_t(vals.size())}) {
      std::vector<uint16_t> want(size_t(n) + 1, 0xabcd);
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = t == DType::bf16 ? f32_to_bf16(vals[size_t(i)]) : f32_to_f16(vals[size_t(i)]);
      for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
        cpu::ScopedMaxIsa cap(isa);
        std::vector<uint16_t> h(size_t(n) + 1, 0xabcd);
        convert_from_f32(vals.data(), h.data(), t, n);
        for (int64_t i = 0; i <= n; ++i) {
          const bool nan = i < n && std::isnan(vals[size_t(i)]);
          if (nan)  // the payload may differ (hardware keeps it), the value must stay a NaN
            ASSERT_TRUE(std::isnan(t == DType::bf16 ? bf16_to_f32(h[size_t(i)]) : f16_to_f32(h[size_t(i)]))) << i;
          else
            ASSERT_EQ(h[size_t(i)], want[size_t(i)]) << cpu::isa_name(isa) << " " << dtype_name(t) << " n " << n << " i " << i;
        }
        std::vector<float> back(size_t(n) + 1, -7.f);
        convert_to_f32(want.data(), t, back.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float w = t == DType::bf16 ? bf16_to_f32(want[size_t(i)]) : f16_to_f32(want[size_t(i)]);
          if (std::isnan(w)) ASSERT_TRUE(std::isnan(back[size_t(i)])) << i;
          else ASSERT_EQ(back[size_t(i)], w) << cpu::isa_name(isa) << " n " << n << " i " << i;
        }
        EXPECT_EQ(back[size_t(n)], -7.f) << "wrote past n = " << n;
      }
    }
}

TEST(Tensor, ViewsAndCopies) {
  Tensor t = Tensor::zeros(DType::f32, {3, 4});
  EXPECT_TRUE(t.view().is_contiguous());
  for (int i = 0; i < 12; ++i) t.ptr<float>()[i] = float(i);
  TensorView col = t.view().select(1, 2);  // column 2: stride 4
  EXPECT_EQ(col.ndim, 1);
  EXPECT_EQ(col.stride(0), 4);
  EXPECT_FALSE(TensorView(t.view().data, DType::f32, {4, 3}, {1, 4}).is_contiguous());
  Tensor c = Tensor::copy_of(col);
  EXPECT_EQ(c.ptr<float>()[2], 10.f);
  Tensor b = Tensor::empty(DType::bf16, {3, 4});
  copy_into(t, b);
  EXPECT_EQ(get_as_double(b, 11), 11.0);
  EXPECT_EQ(t.view().narrow(0, 1, 2).numel(), 8);
  EXPECT_THROW(copy_into(t, Tensor::empty(DType::i32, {3, 4})), Error);
  EXPECT_THROW(copy_into(t, Tensor::empty(DType::f32, {5})), Error);
}

// copy_into's row paths (contiguous, row-strided, on all threads above 64K elements) and its
// element walk (a transposed source) give the bits of the element-by-element definition, for
// every float dtype pair, NaN, Inf and f16 overflow included.
TEST(Tensor, CopyIntoEqualsElementwiseDefinitionAcrossDtypesAndLayouts) {
  const DType fl[] = {DType::f32, DType::bf16, DType::f16};
  for (int64_t rows : {int64_t(3), int64_t(300)}) {
    const int64_t cols = 301;  // odd: vector tails
    Tensor a = Tensor::empty(DType::f32, {rows, cols + 7});
    for (int64_t i = 0; i < a.numel(); ++i) a.ptr<float>()[i] = float(std::sin(double(i)) * 1e3 / double(1 + i % 97));
    a.ptr<float>()[5] = std::numeric_limits<float>::quiet_NaN();
    a.ptr<float>()[9] = -std::numeric_limits<float>::infinity();
    a.ptr<float>()[13] = 1e6f;
    for (DType st : fl)
      for (DType dt : fl) {
        Tensor wide = Tensor::empty(st, {rows, cols + 7});
        for (int64_t i = 0; i < a.numel(); ++i) set_from_double(wide, i, a.ptr<float>()[i]);
        const TensorView strided = wide.view().narrow(1, 3, cols);
        Tensor packed = Tensor::copy_of(strided);
        const TensorView sources[] = {strided, packed.view(), TensorView(packed.view().data, st, {cols, rows}, {1, cols})};
        for (const TensorView& from : sources) {
          Tensor d = Tensor::empty(dt, {from.size(0), from.size(1) + 5});
          const TensorView to = d.view().narrow(1, 2, from.size(1));
          copy_into(from, to);
          Tensor one = Tensor::empty(dt, {1});
          for (int64_t i = 0; i < from.numel(); ++i) {
            set_from_double(one, 0, get_as_double(from, i));
            const double got = get_as_double(to, i), want = get_as_double(one, 0);
            ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : got == want)
                << dtype_name(st) << " -> " << dtype_name(dt) << " from " << from.shape_str() << " at " << i;
          }
        }
      }
  }
}

// Same-shape views with a strided last dim on either side (stacked torch-layout weights read as
// [E, H, I], a transposed destination, integer dtypes): every element lands where the
// element-by-element definition puts it, on one thread and on all (above 64K elements).
TEST(Tensor, CopyIntoStridedLastDimsEqualTheDefinition) {
  for (int64_t E : {int64_t(2), int64_t(9)})
    for (DType t : {DType::f32, DType::bf16, DType::i32, DType::i64, DType::i8}) {
      const int64_t I = 37, H = 200;
      Tensor w = Tensor::empty(t, {E, I, H});  // torch layout: [E, I, H] rows
      for (int64_t i = 0; i < w.numel(); ++i) set_from_double(w, i, double((i * 7919) % 113) - 56.0);
      const TensorView src(w.view().data, t, {E, H, I}, {I * H, 1, H});  // the [E, H, I] view of it
      Tensor packed = Tensor::empty(t, {E, H, I});
      copy_into(src, packed);
      Tensor back = Tensor::empty(t, {E, I, H});
      copy_into(packed, TensorView(back.view().data, t, {E, H, I}, {I * H, 1, H}));  // a transposed destination
      for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < H; h += 13)
          for (int64_t i = 0; i < I; ++i)
            ASSERT_EQ(get_as_double(packed, (e * H + h) * I + i), get_as_double(w, (e * I + i) * H + h)) << dtype_name(t) << " E " << E;
      ASSERT_EQ(std::memcmp(back.view().data, w.view().data, w.view().nbytes()), 0) << dtype_name(t) << " E " << E;
    }
}

TEST(Error, MessageNamesOperatorArgumentAndExpectedForm) {
  try {
    OT_CHECK(false, "moe_init_routing", "expert_idx", "int32", "int64");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "moe_init_routing: argument 'expert_idx': expected int32, got int64");
    EXPECT_EQ(e.op(), "moe_init_routing");
    EXPECT_EQ(e.arg(), "expert_idx");
    EXPECT_EQ(e.expected(), "int32");
    EXPECT_EQ(e.got(), "int64");
  }
  try {
    OT_CHECK(false, "op", "arg", "form");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "op: argument 'arg': expected form");
    EXPECT_EQ(e.got(), "");
  }
}

TEST(Cpu, CapAndForceRef) {
  cpu::Isa det = cpu::detected_isa();
  {
    cpu::ScopedMaxIsa cap(cpu::Isa::scalar);
    EXPECT_EQ(cpu::active_isa(), cpu::Isa::scalar);
  }
  EXPECT_LE(int(cpu::active_isa()), int(det));
  {
    cpu::ScopedForceRef r(true);
    EXPECT_TRUE(cpu::force_ref());
  }
  cpu::Isa parsed;
  EXPECT_TRUE(cpu::parse_isa("avx512_bf16", &parsed));
  EXPECT_EQ(parsed, cpu::Isa::avx512_bf16);
  EXPECT_FALSE(cpu::parse_isa("sse", &parsed));
}

TEST(Parallel, StaticAndDynamicCoverEveryItemOnce) {
  for (int64_t n : {0, 1, 7, 1000}) {
    std::vector<std::atomic<int>> hit(size_t(n + 1));
    parallel_for(n, [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) hit[size_t(i)]++; });
    parallel_for_dynamic(n, 3, [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) hit[size_t(i)]++; });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hit[size_t(i)].load(), 2) << i;
  }
}

// Sized forms: small work runs as one call on the calling thread; larger work is split like the
// plain forms (every item once, in a parallel region when there are threads).
TEST(Parallel, SizedFormsRunSmallWorkInline) {
  set_num_threads(2);
  for (double bytes : {0.0, kInlineWorkBytes - 1, kInlineWorkBytes, 1e8}) {
    const int64_t n = 1000;
    std::vector<std::atomic<int>> hit(static_cast<size_t>(n));
    std::atomic<int> calls{0}, in_region{0};
    auto body = [&](int64_t b, int64_t e) {
      calls += 1;
      in_region += in_parallel_region();
      for (int64_t i = b; i < e; ++i) hit[size_t(i)]++;
    };
    parallel_for_sized(n, bytes, body);
    parallel_for_dynamic_sized(n, 10, bytes, body);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hit[size_t(i)].load(), 2) << i;
    if (bytes < kInlineWorkBytes) {
      EXPECT_EQ(calls.load(), 2) << bytes;
      EXPECT_EQ(in_region.load(), 0) << bytes;
    } else {
      EXPECT_GT(calls.load(), 2) << bytes;
      EXPECT_GT(in_region.load(), 0) << bytes;
    }
  }
  set_num_threads(0);
}

// Operator scopes opened inside a parallel region (nested engine calls of one thread) are folded
// into the enclosing operator's event: one event per top-level call, none per thread.
TEST(Trace, ScopesInsideParallelRegionsAreQuiet) {
  set_num_threads(2);
  trace::take_events();
  trace::set_timeline(true);
  {
    trace::OpScope outer("outer_op");
    EXPECT_TRUE(outer.active());
    std::atomic<int> quiet{0}, calls{0};
    parallel_for(2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        trace::OpScope inner("inner_op");
        calls += 1;
        quiet += !inner.active();
      }
    });
    EXPECT_EQ(calls.load(), 2);
    EXPECT_EQ(quiet.load(), 2);
  }
  trace::set_timeline(false);
  std::vector<trace::Event> ev = trace::take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].name, "outer_op");
  set_num_threads(0);
}

TEST(Workspace, TypedSlotsAreAlignedAndDisjoint) {
  WorkspacePlan plan;
  auto a = plan.add<float>(10);
  auto b = plan.add<int32_t>(3, /*per_thread=*/true);
  Workspace ws(plan);
  float* pa = ws.get(a);
  int32_t* pb0 = ws.get(b, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pa) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pb0) % 64, 0u);
  EXPECT_GE(reinterpret_cast<char*>(pb0) - reinterpret_cast<char*>(pa), 40);
  if (num_threads() > 1) {
    EXPECT_NE(ws.get(b, 1), pb0);
  }
}

}  // namespace test_core
