// grouped_gemm_nt / _nn / _tn (the backward forms) against the engine's fp64 reference
// (ref::matmul on transposed views), on every ISA level this machine has, over thin/odd shapes,
// gathered rows, two K segments, padded strides, accumulate, fp32 and bf16 C (TN), many jobs at
// once, and bad inputs.
#include <gtest/gtest.h>

#include <cstring>

#include "gemm_test_util.h"
#include "ot/error.h"
#include "ot/parallel.h"

namespace ot::gemm::testing {
namespace test_gemm_backward_forms {

// Row-major fp32 matrix with row stride ld (columns beyond `cols` hold NaN: must never be read).
struct Mat {
  Tensor t;
  int64_t rows, cols, ld;
  Mat(DType dt, int64_t r, int64_t c, int64_t pad, uint32_t seed) : rows(r), cols(c), ld(c + pad) {
    t = random_tensor(dt, {std::max<int64_t>(r, 1), ld}, seed);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = c; j < ld; ++j) set_from_double(t, i * ld + j, NAN);
  }
  MatView view(int64_t c0 = 0, int64_t nc = -1) const {
    return {static_cast<const char*>(t.view().data) + c0 * int64_t(dtype_size(t.dtype())), t.dtype(), rows, nc < 0 ? cols : nc, ld, 1};
  }
  const void* data() const { return t.view().data; }
};

double err(const Tensor& fast, const Tensor& ref) { return norm_err(fast, ref); }
constexpr double kTol = 1e-4;  // exact products (inputs are exact in the kernel dtype), fp32 sums

struct NtCase {
  int64_t M, N, K0, K1;
  DType a = DType::bf16, w = DType::bf16;
  bool gather = false, acc = false;
};

// nn: W stored [K][N] (grouped_gemm_nn) instead of [N][K] (grouped_gemm_nt).
void run_nt(const NtCase& cs, const IsaPath& isa, uint32_t seed, bool nn = false) {
  ScopedIsaPath cap(isa);
  const int64_t K = cs.K0 + cs.K1, ldc = cs.N + 3;
  const int64_t src_rows = cs.gather ? cs.M + 5 : cs.M;
  Mat a(cs.a, src_rows, K, 2, seed), w0 = nn ? Mat(cs.w, cs.K0, cs.N, 1, seed + 1) : Mat(cs.w, cs.N, cs.K0, 1, seed + 1),
                                     w1 = nn ? Mat(cs.w, cs.K1, cs.N, 3, seed + 2) : Mat(cs.w, cs.N, cs.K1, 3, seed + 2);
  std::vector<int32_t> rows(size_t(cs.M));
  for (int64_t i = 0; i < cs.M; ++i) rows[size_t(i)] = int32_t((i * 7 + 3) % src_rows);
  Tensor c0 = random_tensor(DType::f32, {std::max<int64_t>(cs.M, 1), ldc}, seed + 3);
  Tensor fast = Tensor::copy_of(c0), want = Tensor::copy_of(c0);
  NtJob j;
  j.M = cs.M;
  j.N = cs.N;
  j.a = {a.data(), cs.a, a.ld, cs.gather ? rows.data() : nullptr};
  j.w_dtype = cs.w;
  j.w[0] = {w0.data(), cs.K0, w0.ld};
  j.w[1] = {w1.data(), cs.K1, w1.ld};
  j.c = fast.ptr<float>();
  j.ldc = ldc;
  j.accumulate = cs.acc;
  if (nn) grouped_gemm_nn(&j, 1);
  else grouped_gemm_nt(&j, 1);
  // Reference: gathered A copy, then A0 W0^T (+ A1 W1^T), or A0 W0 (+ A1 W1).
  Tensor ag = Tensor::empty(cs.a, {std::max<int64_t>(cs.M, 1), a.ld});
  for (int64_t i = 0; i < cs.M; ++i)
    std::memcpy(static_cast<char*>(ag.view().data) + i * a.ld * int64_t(dtype_size(cs.a)),
                static_cast<const char*>(a.data()) + (cs.gather ? rows[size_t(i)] : i) * a.ld * int64_t(dtype_size(cs.a)), size_t(a.ld) * dtype_size(cs.a));
  auto asub = [&](int64_t c, int64_t n) {
    return MatView{static_cast<const char*>(ag.view().data) + c * int64_t(dtype_size(cs.a)), cs.a, cs.M, n, a.ld, 1};
  };
  MutMatView cw{want.view().data, DType::f32, cs.M, cs.N, ldc, 1};
  ref::matmul(asub(0, cs.K0), nn ? w0.view() : w0.view().t(), cw, 1.f, cs.acc ? 1.f : 0.f);
  if (cs.K1 > 0) ref::matmul(asub(cs.K0, cs.K1), nn ? w1.view() : w1.view().t(), cw, 1.f, 1.f);
  EXPECT_LE(err(fast, want), kTol) << (nn ? "nn" : "nt") << " isa " << isa_str(isa) << " M" << cs.M << " N" << cs.N << " K" << cs.K0 << "+" << cs.K1 << " a "
                                   << dtype_name(cs.a) << " w " << dtype_name(cs.w) << " gather " << cs.gather << " acc " << cs.acc;
}

TEST(GemmNt, MatchesReferenceAcrossIsaAndShapes) {
  uint32_t seed = 1;
  for (const IsaPath& isa : isa_paths())
    for (auto dt : {std::pair{DType::bf16, DType::bf16}, std::pair{DType::f32, DType::f32}, std::pair{DType::f16, DType::bf16},
                    std::pair{DType::f32, DType::bf16}})
      for (NtCase cs : {NtCase{1, 97, 130, 0}, NtCase{9, 48, 64, 64}, NtCase{33, 200, 31, 0}, NtCase{17, 47, 2, 3}, NtCase{130, 96, 66, 34},
                        NtCase{8, 1, 1, 0}, NtCase{5, 50, 0, 0}, NtCase{0, 10, 4, 0}, NtCase{7, 100, 7, 9},
                        NtCase{3, 49, 250, 161}, NtCase{300, 20, 40, 0}})  // K chunks across segments; 2 row blocks
        for (bool gather : {false, true})
          for (bool acc : {false, true}) {
            cs.a = dt.first;
            cs.w = dt.second;
            cs.gather = gather;
            cs.acc = acc;
            run_nt(cs, isa, seed++);
            run_nt(cs, isa, seed++, true);
          }
}

// The swapped NT form (bf16, M <= 64: C^T = W A^T with W read in place, tiles of 16/32/48/64
// A rows) around its tile edges: every M from 1 to 49 and 63..65 (65: the panel form), output
// widths across its 192-column units and not multiples of 16, one or two K segments, gathered
// rows, accumulate.
// On AVX-512 BF16 both multiplier forms of its tiles: vdpbf16ps and fp32 FMAs on widened operands.
TEST(GemmNt, SwappedFormEdges) {
  std::vector<int64_t> ms;
  for (int64_t m = 1; m <= 49; ++m) ms.push_back(m);
  for (int64_t m : {63, 64, 65}) ms.push_back(m);
  uint32_t seed = 3000;
  for (const IsaPath& isa : top_vector_isa_paths()) {
    for (int64_t m : ms) {
      NtCase cs{m, m % 2 ? 200 : 57, m % 3 ? 66 : 130, m % 3 ? 34 : 0};
      cs.gather = m % 2 == 0;
      cs.acc = m / 2 % 2 == 1;
      run_nt(cs, isa, seed++);
    }
    // odd K segments fall back to the panel form
    run_nt({32, 100, 65, 0}, isa, seed++);
    run_nt({32, 100, 64, 33, DType::bf16, DType::bf16, true, true}, isa, seed++);
  }
}

// The swapped form's dot tail (the last M % 16 rows, when few, as dot products along K, A and W
// read in place): every M from 1 to 65 (M < 16: the whole job; tails of 1..15 rows on 1-3 zmm
// columns, the last ones back to a whole column), K below, at and past the kernel's 32-element
// steps (masked remainders), two segments with an odd pair count, widths that are not multiples
// of the tile rows (16/12/8/6 and the dot blocks'), gathered rows, accumulate.
TEST(GemmNt, SwappedDotTail) {
  uint32_t seed = 5000;
  const NtCase shapes[] = {{0, 13, 2, 0}, {0, 197, 64, 0}, {0, 385, 94, 0}, {0, 31, 130, 62}, {0, 100, 256, 2}};
  for (int64_t m = 1; m <= 65; ++m) {
    NtCase cs = shapes[m % 5];
    cs.M = m;
    cs.gather = m % 3 == 1;
    cs.acc = m % 4 >= 2;
    run_nt(cs, IsaPath{cpu::detected_isa()}, seed++);
  }
}

// Many NT jobs in one call (swapped and panel forms mixed; units of one job on both threads),
// and from inside a parallel region (runs on the calling thread).
void run_grouped_nt(const std::vector<NtCase>& cases) {
  for (bool nested : {false, true}) {
    std::vector<Mat> as, w0s, w1s;
    std::vector<Tensor> fast, want;
    std::vector<NtJob> jobs;
    for (size_t i = 0; i < cases.size(); ++i) {
      const NtCase& cs = cases[i];
      const uint32_t seed = uint32_t(700 + 5 * i + (nested ? 100 : 0));
      as.emplace_back(DType::bf16, cs.M, cs.K0 + cs.K1, 3, seed);
      w0s.emplace_back(DType::bf16, cs.N, cs.K0, 2, seed + 1);
      w1s.emplace_back(DType::bf16, cs.N, cs.K1, 1, seed + 2);
      fast.push_back(random_tensor(DType::f32, {std::max<int64_t>(cs.M, 1), cs.N}, seed + 3));
      want.push_back(Tensor::copy_of(fast.back()));
      NtJob j;
      j.M = cs.M;
      j.N = cs.N;
      j.a = {as.back().data(), DType::bf16, as.back().ld, nullptr};
      j.w_dtype = DType::bf16;
      j.w[0] = {w0s.back().data(), cs.K0, w0s.back().ld};
      j.w[1] = {w1s.back().data(), cs.K1, w1s.back().ld};
      j.c = fast.back().ptr<float>();
      j.ldc = cs.N;
      j.accumulate = i % 2 == 1;
      jobs.push_back(j);
      MutMatView cw{want.back().view().data, DType::f32, cs.M, cs.N, cs.N, 1};
      ref::matmul(as.back().view(0, cs.K0), w0s.back().view().t(), cw, 1.f, j.accumulate ? 1.f : 0.f);
      if (cs.K1 > 0) ref::matmul(as.back().view(cs.K0, cs.K1), w1s.back().view().t(), cw, 1.f, 1.f);
    }
    if (nested) parallel_for(int64_t(jobs.size()), [&](int64_t b, int64_t e) { grouped_gemm_nt(jobs.data() + b, e - b); });
    else grouped_gemm_nt(jobs.data(), int64_t(jobs.size()));
    for (size_t i = 0; i < cases.size(); ++i) EXPECT_LE(err(fast[i], want[i]), kTol) << "job " << i << " nested " << nested;
  }
}

TEST(GemmNt, GroupedJobsAndNestedCalls) {
  run_grouped_nt({{32, 400, 96, 64}, {1, 50, 40, 0}, {64, 193, 130, 0}, {65, 100, 64, 0}, {17, 600, 31, 0},
                  {0, 30, 8, 0},     {48, 383, 2, 2}, {300, 70, 66, 0}, {40, 800, 128, 128}});
}

// Enough jobs (>= 8 per thread) that whole jobs go to one thread each (every unit of a job in
// order, each tile prefetching the next across unit boundaries): expert-like row counts around
// the tile widths, widths across several units and not multiples of the tile rows, one or two
// K segments, odd K (panel form), empty jobs.
TEST(GemmNt, ManyJobsWholeJobsPerThread) {
  std::vector<NtCase> cases;
  for (int64_t i = 0; i < 40; ++i)
    cases.push_back({i % 7 == 3 ? 0 : (i * 13) % 66 + 1, 100 + (i * 37) % 420, i % 5 == 4 ? 33 : 2 * (i % 9) + 64, i % 2 ? 2 * (i % 4) + 30 : 0});
  run_grouped_nt(cases);
}

struct TnCase {
  int64_t K, M, N;
  DType a = DType::bf16, b = DType::bf16;
  bool acc = false;
  int64_t ldc_pad = 0;
  DType c = DType::f32;
};

// fast: C in cs.c; want: the fp32 reference from the same start (rounded to cs.c by the caller).
void fill_tn(const TnCase& cs, uint32_t seed, Mat& a, Mat& b, Tensor& fast, Tensor& want, TnJob& j) {
  a = Mat(cs.a, cs.K, cs.M, 3, seed);
  b = Mat(cs.b, cs.K, cs.N, 1, seed + 1);
  const int64_t ldc = cs.N + cs.ldc_pad;
  Tensor c0 = random_tensor(cs.c, {std::max<int64_t>(cs.M, 1), ldc}, seed + 2);
  fast = Tensor::copy_of(c0);
  want = Tensor::empty(DType::f32, c0.shape());
  copy_into(c0, want);
  j = TnJob{cs.K, cs.M, cs.N, a.data(), b.data(), cs.a, cs.b, a.ld, b.ld, fast.view().data, ldc, cs.acc, cs.c};
  ref::matmul(a.view().t(), b.view(), MutMatView{want.view().data, DType::f32, cs.M, cs.N, ldc, 1}, 1.f, cs.acc ? 1.f : 0.f);
}

// One job of case cs through grouped_gemm_tn; its error against the reference.
double tn_case_error(const TnCase& cs, uint32_t seed) {
  Mat a(cs.a, 1, 1, 0, 0), b(cs.b, 1, 1, 0, 0);
  Tensor fast, want;
  TnJob j;
  fill_tn(cs, seed, a, b, fast, want, j);
  grouped_gemm_tn(&j, 1);
  return err(fast, want);
}

TEST(GemmTn, MatchesReferenceAcrossIsaAndShapes) {
  uint32_t seed = 100;
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (auto dt : {std::pair{DType::bf16, DType::bf16}, std::pair{DType::f32, DType::f32}, std::pair{DType::f16, DType::f32},
                    std::pair{DType::bf16, DType::f32}})
      for (TnCase cs : {TnCase{1, 130, 97}, TnCase{2, 7, 48}, TnCase{3, 200, 200}, TnCase{17, 64, 96}, TnCase{64, 9, 1}, TnCase{400, 33, 50},
                        TnCase{0, 10, 20}, TnCase{5, 0, 4}, TnCase{33, 40, 416}})
        for (bool acc : {false, true})
          for (int64_t pad : {5, 32})  // unaligned and 64-byte aligned C rows (streaming stores)
            for (DType c : {DType::f32, DType::bf16}) {
              if (c == DType::bf16 && dt.first != DType::bf16) continue;
              cs.a = dt.first;
              cs.b = dt.second;
              cs.acc = acc;
              cs.ldc_pad = pad;
              cs.c = c;
              // bf16 C: the fp32 result rounded once (half an ulp, 2^-9 relative)
              EXPECT_LE(tn_case_error(cs, seed), c == DType::bf16 ? 4e-3 : kTol)
                  << "isa " << isa_str(isa) << " K" << cs.K << " M" << cs.M << " N" << cs.N << " " << dtype_name(cs.a) << "/"
                  << dtype_name(cs.b) << " acc " << acc << " pad " << pad << " c " << dtype_name(c);
              seed += 3;
            }
  }
}

// The direct-store path (bf16 operands on AVX512_BF16: 64-column panels, 6-row kernel writing C
// from its registers): whole aligned 64-column segments take the streaming stores, the rest
// (row and column edges, unaligned rows, accumulate) the masked ones. K = 1, odd and even K,
// M around multiples of 6, N multiples of 64 and not, units with one and several panels. Both
// multiplier forms: vdpbf16ps and fp32 FMAs on widened operands (gemm.bf16_kernel 1 / 2).
TEST(GemmTn, DirectPathEdges) {
  if (!cpu::has(cpu::Isa::avx512_bf16)) GTEST_SKIP() << "no AVX512_BF16";
  uint32_t seed = 7000;
  for (const IsaPath& isa : top_vector_isa_paths()) {
    ScopedIsaPath cap(isa);
    for (TnCase cs : {TnCase{1, 6, 64}, TnCase{2, 7, 128}, TnCase{31, 13, 256}, TnCase{32, 96, 320}, TnCase{33, 100, 200}, TnCase{5, 5, 65},
                      TnCase{300, 12, 192}, TnCase{0, 8, 64}})
      for (bool acc : {false, true})
        for (int64_t pad : {0, 8})  // rows 64-byte aligned (fp32 and bf16) / alternately not
          for (DType c : {DType::f32, DType::bf16}) {
            cs.acc = acc;
            cs.ldc_pad = pad;
            cs.c = c;
            EXPECT_LE(tn_case_error(cs, seed), c == DType::bf16 ? 4e-3 : kTol)
                << "isa " << isa_str(isa) << " K" << cs.K << " M" << cs.M << " N" << cs.N << " acc " << acc << " pad " << pad << " c " << dtype_name(c);
            seed += 3;
          }
  }
}

// Many jobs of different shapes in one call (dynamic units over jobs, both threads), also from
// inside a parallel region (runs on the calling thread).
TEST(GemmTn, GroupedJobsAndNestedCalls) {
  std::vector<TnCase> cases = {{1, 300, 200, DType::bf16, DType::bf16, false, 0}, {33, 129, 97, DType::bf16, DType::bf16, true, 0},
                               {0, 50, 60, DType::bf16, DType::bf16, false, 0},   {7, 256, 300, DType::bf16, DType::bf16, false, 16},
                               {2, 1, 1, DType::bf16, DType::bf16, true, 0}};
  std::vector<Mat> as, bs;
  std::vector<Tensor> fast(cases.size()), want(cases.size());
  std::vector<TnJob> jobs(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    as.emplace_back(DType::bf16, 1, 1, 0, 0);
    bs.emplace_back(DType::bf16, 1, 1, 0, 0);
  }
  for (size_t i = 0; i < cases.size(); ++i) fill_tn(cases[i], uint32_t(500 + 7 * i), as[i], bs[i], fast[i], want[i], jobs[i]);
  grouped_gemm_tn(jobs.data(), int64_t(jobs.size()));
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_LE(err(fast[i], want[i]), kTol) << "job " << i;
  for (size_t i = 0; i < cases.size(); ++i) fill_tn(cases[i], uint32_t(900 + 7 * i), as[i], bs[i], fast[i], want[i], jobs[i]);
  parallel_for(int64_t(jobs.size()), [&](int64_t b, int64_t e) { grouped_gemm_tn(jobs.data() + b, e - b); });
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_LE(err(fast[i], want[i]), kTol) << "nested job " << i;
}

// Consecutive jobs on the same A (a, lda, K, M, dtype: x^T for dW_gate and dW_up) share one packed
// A^T; a job on the same pointer with another M, lda or K, a job whose previous job is empty, and
// a third job in a row must still be right. Every ISA level (direct and tile paths), bf16 and fp32 C.
TEST(GemmTn, JobsSharingAPackedA) {
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType cdt : {DType::f32, DType::bf16}) {
      const int64_t K = 9, M = 70;
      Mat a(DType::bf16, K, M, 3, 41);
      struct Use { int64_t K, M, lda, N; bool acc; };
      // same A three times; fewer columns (M); a smaller K; every other row (lda); an empty job; same A
      const std::vector<Use> uses = {{K, M, a.ld, 130, false}, {K, M, a.ld, 64, true}, {K, M, a.ld, 7, false}, {K, M - 6, a.ld, 50, false},
                                     {K - 2, M - 6, a.ld, 50, false}, {K / 2, M - 6, 2 * a.ld, 33, true}, {K, M, a.ld, 0, false}, {K, M, a.ld, 96, false}};
      std::vector<Mat> bs;
      std::vector<Tensor> fast, want;
      std::vector<TnJob> jobs;
      for (size_t i = 0; i < uses.size(); ++i) bs.emplace_back(DType::bf16, K, std::max<int64_t>(uses[i].N, 1), 2, uint32_t(60 + i));
      for (size_t i = 0; i < uses.size(); ++i) {
        const Use& u = uses[i];
        const int64_t ldc = std::max<int64_t>(u.N, 1) + 16;
        Tensor c0 = random_tensor(cdt, {u.M, ldc}, uint32_t(80 + i));
        fast.push_back(Tensor::copy_of(c0));
        want.push_back(Tensor::empty(DType::f32, c0.shape()));
        copy_into(c0, want.back());
        jobs.push_back(TnJob{u.K, u.M, u.N, a.data(), bs[i].data(), DType::bf16, DType::bf16, u.lda, bs[i].ld, fast.back().view().data, ldc, u.acc, cdt});
        MatView av{a.data(), DType::bf16, u.K, u.M, u.lda, 1};
        MatView bv{bs[i].data(), DType::bf16, u.K, u.N, bs[i].ld, 1};
        ref::matmul(av.t(), bv, MutMatView{want.back().view().data, DType::f32, u.M, u.N, ldc, 1}, 1.f, u.acc ? 1.f : 0.f);
      }
      grouped_gemm_tn(jobs.data(), int64_t(jobs.size()));
      for (size_t i = 0; i < uses.size(); ++i)
        EXPECT_LE(err(fast[i], want[i]), cdt == DType::bf16 ? 4e-3 : kTol) << "isa " << isa_str(isa) << " job " << i << " c " << dtype_name(cdt);
    }
  }
}

// bf16 C is the fp32 sum rounded to nearest even (the direct path converts with vcvtne2ps2bf16 /
// vcvtneps2bf16, the others with the integer rounding): sums 256 + d are exact in fp32 and fall
// on bf16 ties for odd d (257 -> 256, 259 -> 260; truncation would give 258). Every ISA level,
// streaming (aligned whole panels) and masked (partial panel, accumulate into zeros) stores.
TEST(GemmTn, Bf16CRoundsToNearestEven) {
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (auto [N, acc] : {std::pair<int64_t, bool>{128, false}, std::pair<int64_t, bool>{100, false}, std::pair<int64_t, bool>{128, true}}) {
      const int64_t K = 2, M = 7;
      Tensor a = Tensor::empty(DType::bf16, {K, M}), b = Tensor::empty(DType::bf16, {K, N}), c = Tensor::empty(DType::bf16, {M, N});
      for (int64_t i = 0; i < K * M; ++i) set_from_double(a, i, 1.0);
      for (int64_t n = 0; n < N; ++n) {
        set_from_double(b, n, n % 2 ? -256.0 : 256.0);
        set_from_double(b, N + n, double((n % 2 ? -1 : 1) * (n % 9)));
      }
      for (int64_t i = 0; i < M * N; ++i) set_from_double(c, i, acc ? 0.0 : NAN);
      TnJob j{K, M, N, a.view().data, b.view().data, DType::bf16, DType::bf16, M, N, c.view().data, N, acc, DType::bf16};
      grouped_gemm_tn(&j, 1);
      const uint16_t* got = c.ptr<uint16_t>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const float sum = float((n % 2 ? -1 : 1) * (256 + n % 9));
          ASSERT_EQ(got[m * N + n], f32_to_bf16(sum)) << "isa " << isa_str(isa) << " N" << N << " acc " << acc << " m" << m << " n" << n << " sum " << sum;
        }
    }
  }
}

TEST(GemmBackwardForms, ForceRefAgrees) {
  cpu::ScopedForceRef fr(true);
  run_nt({9, 50, 6, 4, DType::bf16, DType::bf16, true, true}, IsaPath{cpu::detected_isa()}, 77);
  run_nt({9, 50, 6, 4, DType::bf16, DType::bf16, true, true}, IsaPath{cpu::detected_isa()}, 78, true);
  Mat a(DType::bf16, 1, 1, 0, 0), b(DType::bf16, 1, 1, 0, 0);
  Tensor fast, want;
  TnJob j;
  fill_tn({5, 20, 30, DType::bf16, DType::bf16, true, 0}, 88, a, b, fast, want, j);
  grouped_gemm_tn(&j, 1);
  EXPECT_LE(err(fast, want), kTol);
}

TEST(GemmBackwardForms, BadInputsThrowBeforeWriting) {
  float c[4] = {1, 2, 3, 4};
  float a[4] = {0, 0, 0, 0};
  TnJob t{2, 2, 2, a, a, DType::f32, DType::f32, 1, 2, c, 2, false};  // lda < M
  EXPECT_THROW(grouped_gemm_tn(&t, 1), Error);
  t.lda = 2;
  t.ldc = 1;  // ldc < N
  EXPECT_THROW(grouped_gemm_tn(&t, 1), Error);
  t.ldc = 2;
  t.a_dtype = DType::i32;
  EXPECT_THROW(grouped_gemm_tn(&t, 1), Error);
  t.a_dtype = DType::f32;
  t.c_dtype = DType::f16;
  EXPECT_THROW(grouped_gemm_tn(&t, 1), Error);
  NtJob n;
  n.M = 2;
  n.N = 2;
  n.a = {a, DType::f32, 1, nullptr};  // ld < K
  n.w[0] = {a, 2, 2};
  n.c = c;
  n.ldc = 2;
  EXPECT_THROW(grouped_gemm_nt(&n, 1), Error);
  n.a.ld = 2;
  n.w[0] = {a, 2, 1};  // NN: ld < N
  EXPECT_THROW(grouped_gemm_nn(&n, 1), Error);
  n.w[0] = {a, 2, 2};
  n.c = nullptr;
  EXPECT_THROW(grouped_gemm_nt(&n, 1), Error);
  EXPECT_THROW(grouped_gemm_nn(&n, 1), Error);
  EXPECT_EQ(c[0], 1.f);
  EXPECT_EQ(c[3], 4.f);
}

}  // namespace test_gemm_backward_forms
}  // namespace ot::gemm::testing
