// The decode micro-kernel (kernel_bf16_decode__avx512bf16.cpp: 1-2 row tiles over a whole panel,
// read as two k-ranges side by side): directly against an fp64 dot product of the packed panel
// layout for every row count it serves and the ones it hands on (1..4), even k lengths that split
// unevenly between the streams (pair counts 0, 1, 15, 17, 383, 1024, 1025), padded A rows, and
// accumulation onto C; the unit form (kernel_decode_panels_bf16 and the AVX2
// kernel_decode_panels_avx2_bf16: n panels paired side by side, odd n, rows 1..3 and 4..8 handed on);
// and through gemm() at decode sizes (M 1..8, odd K, N tails, units of several panels, SwiGLU,
// gathered A rows, weighted scatter-add; every value of the gemm.decode_rows knob) against
// ref::gemm; and 1-3 row groups inside prefill-sized grouped calls.
#include <cmath>
#include <vector>

#include "gemm_test_util.h"
#include "ot/parallel.h"
#include "src/core/knobs.h"
#include "src/gemm/internal.h"

namespace test_decode {
using namespace ot;
using namespace ot::gemm;
using namespace ot::gemm::testing;

namespace {

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

}  // namespace

TEST(GemmDecode, KernelMatchesFp64DotOfThePanel) {
  if (!cpu::has(cpu::Isa::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16";
  using namespace ot::gemm::detail;
  for (int64_t pairs : {0, 1, 15, 17, 383, 1024, 1025})
    for (int mr = 1; mr <= 4; ++mr)
      for (bool load_c : {false, true}) {
        const int64_t kc = 2 * pairs, lda = kc + 6, ldc = kNR + 16;
        std::vector<uint16_t> b = random_bf16(size_t(kc) * kNR + 32, uint32_t(pairs * 8 + mr));  // +32: 64-byte aligned start below
        uint16_t* bp = b.data() + (64 - reinterpret_cast<uintptr_t>(b.data()) % 64) / 2 % 32;
        std::vector<uint16_t> a = random_bf16(size_t(mr * lda), uint32_t(pairs + 100 * mr));
        std::vector<float> c(size_t(mr * ldc)), c0(c.size());
        for (size_t i = 0; i < c.size(); ++i) c0[i] = c[i] = float(i % 7) - 3.f;
        kernel_decode_bf16(mr, kc, a.data(), lda, bp, c.data(), ldc, load_c);
        double maxerr = 0, maxref = 1e-30;
        for (int r = 0; r < mr; ++r)
          for (int j = 0; j < kNR; ++j) {
            double s = load_c ? c0[size_t(r * ldc + j)] : 0.0;
            for (int64_t k = 0; k < kc; ++k)  // panel layout [kc/2][48][2]
              s += double(bf16_to_f32(a[size_t(r * lda + k)])) * double(bf16_to_f32(bp[(k / 2) * 2 * kNR + 2 * j + (k & 1)]));
            maxerr = std::max(maxerr, std::fabs(s - double(c[size_t(r * ldc + j)])));
            maxref = std::max(maxref, std::fabs(s));
          }
        EXPECT_LE(maxerr / maxref, 1e-5) << "pairs=" << pairs << " mr=" << mr << " load_c=" << load_c;
        for (int r = 0; r < mr; ++r)  // columns past the tile untouched
          for (int j = kNR; j < ldc; ++j) EXPECT_EQ(c[size_t(r * ldc + j)], c0[size_t(r * ldc + j)]);
      }
}

// The AVX2 bf16 tile kernel (kernel_avx2_bf16, bf16 A; kernel_avx2_bf16_f32a, fp32 A) as a decode-
// sized row block runs it: one tile of 1..8 rows over a whole panel (1-4 rows: one group, 5-6: the
// 12-accumulator group, 7-8: two groups), pair counts around its 128-pair K chunks, with and without
// accumulation onto C, against an fp64 dot product of the panel.
TEST(GemmDecode, Avx2TileKernelMatchesFp64DotOfThePanel) {
  if (!cpu::has(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
  using namespace ot::gemm::detail;
  for (bool f32a : {false, true})
    for (int64_t pairs : {0, 1, 17, 127, 128, 129, 300, 1025})
      for (int mr = 1; mr <= 8; ++mr)
        for (bool load_c : {false, true}) {
          const int64_t kc = 2 * pairs, lda = kc + 6, ldc = kNR + 16;
          std::vector<uint16_t> b = random_bf16(size_t(kc) * kNR + 32, uint32_t(pairs * 8 + mr));
          uint16_t* bp = b.data() + (64 - reinterpret_cast<uintptr_t>(b.data()) % 64) / 2 % 32;
          std::vector<uint16_t> a = random_bf16(size_t(mr * lda), uint32_t(pairs + 100 * mr));
          std::vector<float> af(a.size());
          for (size_t i = 0; i < a.size(); ++i) af[i] = bf16_to_f32(a[i]);
          std::vector<float> c(size_t(mr * ldc)), c0(c.size());
          for (size_t i = 0; i < c.size(); ++i) c0[i] = c[i] = float(i % 7) - 3.f;
          if (f32a) kernel_avx2_bf16_f32a(mr, kc, af.data(), lda, bp, c.data(), ldc, load_c);
          else kernel_avx2_bf16(mr, kc, a.data(), lda, bp, c.data(), ldc, load_c);
          double maxerr = 0, maxref = 1e-30;
          for (int r = 0; r < mr; ++r)
            for (int j = 0; j < kNR; ++j) {
              double sum = load_c ? c0[size_t(r * ldc + j)] : 0.0;
              for (int64_t k = 0; k < kc; ++k)
                sum += double(af[size_t(r * lda + k)]) * double(bf16_to_f32(bp[(k / 2) * 2 * kNR + 2 * j + (k & 1)]));
              maxerr = std::max(maxerr, std::fabs(sum - double(c[size_t(r * ldc + j)])));
              maxref = std::max(maxref, std::fabs(sum));
            }
          EXPECT_LE(maxerr / maxref, 1e-5) << "f32a=" << f32a << " pairs=" << pairs << " mr=" << mr << " load_c=" << load_c;
          for (int r = 0; r < mr; ++r)  // columns past the tile untouched
            for (int j = kNR; j < ldc; ++j) EXPECT_EQ(c[size_t(r * ldc + j)], c0[size_t(r * ldc + j)]) << "mr=" << mr << " r=" << r;
        }
}

TEST(GemmDecode, PanelsKernelMatchesFp64DotOfEachPanel) {
  // kernel_decode_panels_bf16 (AVX512-BF16) and kernel_decode_panels_avx2_bf16: n panels of one unit
  // (pairs i, i + n/2 side by side, an odd last one alone), tiles overwritten (no load_c); rows
  // 1..3 and 4..8 handed on to the 8-row kernel; pair counts around the
  // AVX2 kernel's 64-pair chunks (1-2 rows) and 32-pair chunks (3 rows).
  using namespace ot::gemm::detail;
  using PanelsFn = void (*)(int, int64_t, const void*, int64_t, const char* const*, float* const*, int, int64_t);
  struct Form { const char* name; cpu::Isa isa; PanelsFn fn; };
  int ran = 0;
  for (const Form& form : {Form{"avx512_bf16", cpu::Isa::avx512_bf16, kernel_decode_panels_bf16},
                           Form{"avx2", cpu::Isa::avx2, kernel_decode_panels_avx2_bf16}}) {
    if (!cpu::has(form.isa)) continue;
    ++ran;
    for (int64_t pairs : {0, 1, 17, 31, 32, 33, 63, 64, 65, 1025})
      for (int n : {0, 1, 2, 3, 5, 8, 9})
        for (int mr = 1; mr <= 8; ++mr) {
          SCOPED_TRACE(form.name);
          const int64_t kc = 2 * pairs, lda = kc + 6, ldc = 2 * kNR + 16, psz = kc * kNR;
          std::vector<uint16_t> b = random_bf16(size_t(n * psz) + 32, uint32_t(pairs * 16 + n * 5 + mr));
          uint16_t* bp = b.data() + (64 - reinterpret_cast<uintptr_t>(b.data()) % 64) / 2 % 32;
          std::vector<uint16_t> a = random_bf16(size_t(mr * lda), uint32_t(pairs + 100 * mr));
          std::vector<float> c(size_t(n * mr * ldc), 7.f);
          std::vector<const char*> pp(size_t(n) + 1);
          std::vector<float*> tp(size_t(n) + 1);
          for (int i = 0; i < n; ++i) pp[size_t(i)] = reinterpret_cast<const char*>(bp + i * psz), tp[size_t(i)] = c.data() + i * mr * ldc + (i % 2) * kNR;
          form.fn(mr, kc, a.data(), lda, pp.data(), tp.data(), n, ldc);
          for (int i = 0; i < n; ++i) {
            double maxerr = 0, maxref = 1e-30;
            for (int r = 0; r < mr; ++r)
              for (int j = 0; j < kNR; ++j) {
                double sum = 0;
                for (int64_t k = 0; k < kc; ++k)
                  sum += double(bf16_to_f32(a[size_t(r * lda + k)])) * double(bf16_to_f32(bp[i * psz + (k / 2) * 2 * kNR + 2 * j + (k & 1)]));
                maxerr = std::max(maxerr, std::fabs(sum - double(tp[size_t(i)][r * ldc + j])));
                maxref = std::max(maxref, std::fabs(sum));
              }
            EXPECT_LE(maxerr / maxref, 1e-5) << "pairs=" << pairs << " n=" << n << " i=" << i << " mr=" << mr;
            const float* tile = c.data() + i * mr * ldc;  // the other 48 + 16 columns of each row untouched
            for (int r = 0; r < mr; ++r)
              for (int j = 0; j < ldc; ++j) {
                if (j / kNR != i % 2 || j >= 2 * kNR) {
                  EXPECT_EQ(tile[r * ldc + j], 7.f) << "n=" << n << " i=" << i << " r=" << r << " j=" << j;
                }
              }
          }
        }
  }
  if (!ran) GTEST_SKIP() << "no decode kernel for this CPU";
}

TEST(GemmDecode, DecodeSizesThroughGemmMatchReference) {
  std::mt19937 rng(11);
  // Every value of the decode-rows knob (an `ot bench --ab` side must compute the same product).
  for (int drows = 0; drows <= detail::kDecodeRows; ++drows) {  // this machine's ISA only: the other paths' decode sizes are covered by test_gemm.cpp
    knobs::set("gemm.decode_rows", drows);
    const cpu::Isa isa = cpu::detected_isa();
    for (int64_t M = 1; M <= 8; ++M)  // 4-8: decode-sized blocks on the 8-row kernel (AVX2: 5-6 one group, 7-8 two)
      for (int64_t K : {1, 33, 2049})
        for (int64_t N : {1, 49, 98, 2930})  // 2930: 62 panels, units of 8 (the paired streams) and a tail
          for (int variant = 0; variant < 2; ++variant) {
            if (N == 2930 && K != 33) continue;  // the wide case for the unit form only (kept fast)
            // variant 0: plain rows, f32 C; 1: gathered A rows (as the MoE up GEMM), SwiGLU, row scale
            // and scatter-add into f32 C (as the down GEMM).
            if (variant == 1 && N % 2) continue;
            const bool swiglu = variant == 1;
            const int64_t n_out = swiglu ? N / 2 : N, lda = K + 3, ldc = n_out + 5, c_rows = M + 3;
            Tensor a = random_tensor(DType::bf16, {M, lda}, uint32_t(M * 7 + K));
            Tensor b = random_tensor(DType::bf16, {N, K}, uint32_t(K * 3 + N));
            std::vector<float> scale = to_f32(random_tensor(DType::f32, {M}, uint32_t(N), 0.5f, 1.5f));
            std::vector<int32_t> scatter(static_cast<size_t>(M)), gather(static_cast<size_t>(M));
            for (auto& s : scatter) s = int32_t(rng() % uint32_t(c_rows));
            for (size_t i = 0; i < gather.size(); ++i) gather[i] = int32_t((i * 5 + 2) % size_t(M));
            Tensor c0 = random_tensor(DType::f32, {c_rows, ldc}, uint32_t(M + N + K));
            Tensor cf = Tensor::copy_of(c0), cr = Tensor::copy_of(c0);
            Epilogue ep;
            if (swiglu) {
              ep.act = Act::swiglu;
              ep.row_scale = scale.data();
              ep.scatter_rows = scatter.data();
              ep.accumulate = true;
            }
            AOperand ao{a.view().data, DType::bf16, lda, swiglu ? gather.data() : nullptr};
            PackedB pb = prepack(b, BLayout::NK);
            ot::gemm::gemm(M, ao, pb, {cf.view().data, DType::f32, ldc}, ep);
            ref::gemm(M, ao, b, BLayout::NK, {cr.view().data, DType::f32, ldc}, ep);
            EXPECT_LE(norm_err(cf, cr), 1e-4) << "isa=" << isa_str(isa) << " decode_rows=" << drows << " M=" << M << " K=" << K << " N=" << N
                                              << " swiglu=" << swiglu;
          }
  }
  knobs::set("gemm.decode_rows", knobs::find("gemm.decode_rows").default_value());
}

// Row blocks of 1-3 rows inside prefill-sized grouped calls (many groups of 9-20 rows: one unit per
// group's whole row block, more than 16 panels a unit) take the decode kernel too, its panels in
// groups of at most 16: plain rows (dynamic units), weighted scatter-add (race-free split, a thread's
// share of 11-21 panels), SwiGLU (34 panels: pairs kept together); 1, 2 and 3 threads.
TEST(GemmDecode, DecodeRowBlocksInsidePrefillCalls) {
  const int64_t K = 72, rows_out = 41, G = 36;  // 5 groups of 1-3 rows (every 7th) among 31 of 9-20
  struct Shape { int64_t N; bool swiglu, scatter; };
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const Shape& sh : {Shape{1000, false, false}, Shape{1000, false, true}, Shape{1600, true, false}, Shape{1600, true, true}}) {
      const int64_t nout = sh.swiglu ? sh.N / 2 : sh.N;
      std::mt19937 rng(uint32_t(sh.N + threads));
      std::vector<int64_t> Ms(G);
      int64_t total = 0;
      for (int64_t g = 0; g < G; ++g) total += Ms[size_t(g)] = g % 7 == 3 ? 1 + g % 3 : 9 + int64_t(rng() % 12);  // 1-3 rows every 7th group
      Tensor x = random_tensor(DType::bf16, {50, K}, 2), w = random_tensor(DType::bf16, {K, sh.N}, uint32_t(sh.N));
      PackedB pw = prepack(w, BLayout::KN);
      std::vector<std::vector<int32_t>> gather(static_cast<size_t>(G)), scatter(static_cast<size_t>(G));
      std::vector<std::vector<float>> scale(static_cast<size_t>(G));
      const int64_t c_rows = sh.scatter ? rows_out : total;
      Tensor c_fast = random_tensor(DType::f32, {c_rows, nout}, 5), c_ref = Tensor::copy_of(c_fast);
      std::vector<Group> groups(static_cast<size_t>(G));
      for (int64_t g = 0, off = 0; g < G; off += Ms[size_t(g)], ++g) {
        for (int64_t i = 0; i < Ms[size_t(g)]; ++i) {
          gather[size_t(g)].push_back(int32_t(rng() % 50));
          scatter[size_t(g)].push_back(int32_t(rng() % rows_out));
          scale[size_t(g)].push_back(0.5f + float(rng() % 3) * 0.25f);
        }
        Group& gr = groups[size_t(g)];
        gr.M = Ms[size_t(g)];
        gr.a = {x.view().data, DType::bf16, K, gather[size_t(g)].data()};
        gr.b = &pw;
        gr.ep.act = sh.swiglu ? Act::swiglu : Act::none;
        if (sh.scatter) {
          gr.c = {c_fast.view().data, DType::f32, nout};
          gr.ep.scatter_rows = scatter[size_t(g)].data();
          gr.ep.row_scale = scale[size_t(g)].data();
          gr.ep.accumulate = true;
        } else {
          gr.c = {c_fast.ptr<float>() + off * nout, DType::f32, nout};
        }
      }
      grouped_gemm(groups.data(), G);
      for (Group gr : groups) {
        gr.c.data = c_ref.ptr<float>() + (static_cast<const float*>(gr.c.data) - c_fast.ptr<float>());
        ref::gemm(gr.M, gr.a, w, BLayout::KN, gr.c, gr.ep);
      }
      EXPECT_LE(norm_err(c_fast, c_ref), 1e-4) << "threads=" << threads << " N=" << sh.N << " swiglu=" << sh.swiglu << " scatter=" << sh.scatter;
    }
  }
  set_num_threads(0);
}

}  // namespace test_decode
