// grouped_gemm (empty groups, ragged M, scatter-accumulate colliding across groups) and matmul
// (strided and transposed operands, mixed dtypes, alpha/beta, calls from inside parallel regions).
#include <atomic>
#include <cstring>

#include "gemm_test_util.h"
#include "ot/error.h"
#include "ot/parallel.h"

namespace test_grouped_matmul {
using namespace ot;
using namespace ot::gemm;
using namespace ot::gemm::testing;

TEST(GroupedGemm, RaggedGroupsScatterAccumulateRaceFree) {
  const int64_t N = 146, K = 72, rows_out = 23;
  const std::vector<int64_t> Ms = {0, 5, 40, 0, 17, 130, 1};
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType t : {DType::bf16, DType::f32}) {
      Tensor x = random_tensor(t, {300, K}, 1);
      std::vector<Tensor> w;
      std::vector<PackedB> pw;
      std::vector<std::vector<int32_t>> gather(Ms.size()), scatter(Ms.size());
      std::vector<std::vector<float>> scale(Ms.size());
      std::mt19937 rng(3);
      for (size_t g = 0; g < Ms.size(); ++g) {
        w.push_back(random_tensor(t, {N, K}, uint32_t(10 + g)));
        pw.push_back(prepack(w.back(), BLayout::NK));
        for (int64_t i = 0; i < Ms[g]; ++i) {
          gather[g].push_back(int32_t(rng() % 300));
          scatter[g].push_back(int32_t(rng() % rows_out));  // collides within and across groups
          scale[g].push_back(0.25f + float(rng() % 4) * 0.25f);
        }
      }
      Tensor c_fast = random_tensor(DType::f32, {rows_out, N}, 7), c_ref = Tensor::copy_of(c_fast);
      std::vector<Group> groups(Ms.size());
      for (size_t g = 0; g < Ms.size(); ++g) {
        Group& gr = groups[g];
        gr.M = Ms[g];
        gr.a = {x.view().data, t, K, gather[g].data()};
        gr.b = &pw[g];
        gr.c = {c_fast.view().data, DType::f32, N};
        gr.ep.scatter_rows = scatter[g].data();
        gr.ep.row_scale = scale[g].data();
        gr.ep.accumulate = true;
      }
      grouped_gemm(groups.data(), int64_t(groups.size()));
      for (size_t g = 0; g < Ms.size(); ++g) {
        Group gr = groups[g];
        gr.c.data = c_ref.view().data;
        ref::gemm(gr.M, gr.a, w[g], BLayout::NK, gr.c, gr.ep);
      }
      EXPECT_LE(norm_err(c_fast, c_ref), 1e-5) << "isa=" << isa_str(isa) << " " << dtype_name(t);
    }
  }
}

// Every row count of one row block (0..41: each split into balanced micro-tiles, e.g. 25 -> 7+6+6+6)
// with K over several K blocks (the tile accumulates across them) and the prefetched scatter-add
// epilogue, as the MoE down GEMM runs it.
TEST(GroupedGemm, EveryRowCountBalancedTilesScatterAccumulate) {
  const int64_t N = 100, K = 400, rows_out = 37;
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType t : {DType::bf16, DType::f32}) {
      Tensor x = random_tensor(t, {64, K}, 2), w = random_tensor(t, {K, N}, 4);
      PackedB pw = prepack(w, BLayout::KN);
      std::mt19937 rng(5);
      std::vector<std::vector<int32_t>> gather(42), scatter(42);
      std::vector<Group> groups(42);
      Tensor c_fast = random_tensor(DType::f32, {rows_out, N}, 8), c_ref = Tensor::copy_of(c_fast);
      for (int64_t M = 0; M < 42; ++M) {
        for (int64_t i = 0; i < M; ++i) {
          gather[size_t(M)].push_back(int32_t(rng() % 64));
          scatter[size_t(M)].push_back(int32_t(rng() % rows_out));
        }
        Group& gr = groups[size_t(M)];
        gr.M = M;
        gr.a = {x.view().data, t, K, gather[size_t(M)].data()};
        gr.b = &pw;
        gr.c = {c_fast.view().data, DType::f32, N};
        gr.ep.scatter_rows = scatter[size_t(M)].data();
        gr.ep.accumulate = true;
      }
      grouped_gemm(groups.data(), int64_t(groups.size()));
      for (Group gr : groups) {
        gr.c.data = c_ref.view().data;
        ref::gemm(gr.M, gr.a, w, BLayout::KN, gr.c, gr.ep);
      }
      EXPECT_LE(norm_err(c_fast, c_ref), 1e-5) << "isa=" << isa_str(isa) << " " << dtype_name(t);
    }
  }
}

// The race-free split of a scatter-accumulating call at 16-column granularity: every output column
// summed exactly once by exactly one thread, whatever N (not a multiple of 16 or 48, N < 48, the
// 16-column partial panels of an even split), ragged M 1..65 with empty groups, K past one K block,
// SwiGLU on the same split, decode-sized jobs inside a split call (whole-panel kernel, sub-range
// epilogue), and calls whose rows are decode-sized on average (whole-block split); 1, 2 and 3 threads.
TEST(GroupedGemm, ColumnSplitAt16ColumnsScatterAccumulate) {
  const int64_t rows_out = 29;
  const std::vector<std::vector<int64_t>> row_sets = {{0, 1, 5, 17, 33, 65, 2, 0}, {1, 2, 1, 0, 1}, {40}};
  struct Shape { int64_t N, K; bool swiglu; };
  const std::vector<Shape> shapes = {{16, 40, false}, {32, 200, false}, {40, 40, false}, {47, 72, false}, {48, 40, false},
                                     {64, 200, false}, {100, 40, false}, {130, 72, false}, {290, 40, false}, {2 * 40, 40, true},
                                     {2 * 70, 200, true}};
  for (const IsaPath& isa : isa_paths()) {
    // Every thread count from AVX-512 up (the 16-column split); the lower paths' kernels have no
    // column subsets (whole-panel fallback with a sub-range epilogue) and run at 2 threads.
    for (int threads : isa >= cpu::Isa::avx512 ? std::vector<int>{1, 2, 3} : std::vector<int>{2}) {
      set_num_threads(threads);
      ScopedIsaPath cap(isa);
      for (const Shape& sh : shapes)
        for (size_t set = 0; set < row_sets.size(); ++set) {
          const std::vector<int64_t>& Ms = row_sets[set];
          const int64_t nout = sh.swiglu ? sh.N / 2 : sh.N;
          Tensor x = random_tensor(DType::bf16, {70, sh.K}, 1), w = random_tensor(DType::bf16, {sh.K, sh.N}, uint32_t(sh.N));
          PackedB pw = prepack(w, BLayout::KN);
          std::mt19937 rng(uint32_t(7 + set));
          std::vector<std::vector<int32_t>> gather(Ms.size()), scatter(Ms.size());
          std::vector<std::vector<float>> scale(Ms.size());
          std::vector<Group> groups(Ms.size());
          Tensor c_fast = random_tensor(DType::f32, {rows_out, nout}, 5), c_ref = Tensor::copy_of(c_fast);
          for (size_t g = 0; g < Ms.size(); ++g) {
            for (int64_t i = 0; i < Ms[g]; ++i) {
              gather[g].push_back(int32_t(rng() % 70));
              scatter[g].push_back(int32_t(rng() % rows_out));
              scale[g].push_back(0.5f + float(rng() % 3) * 0.25f);
            }
            Group& gr = groups[g];
            gr.M = Ms[g];
            gr.a = {x.view().data, DType::bf16, sh.K, gather[g].data()};
            gr.b = &pw;
            gr.c = {c_fast.view().data, DType::f32, nout};
            gr.ep.scatter_rows = scatter[g].data();
            gr.ep.row_scale = scale[g].data();
            gr.ep.accumulate = true;
            gr.ep.act = sh.swiglu ? Act::swiglu : Act::none;
          }
          grouped_gemm(groups.data(), int64_t(groups.size()));
          for (Group gr : groups) {
            gr.c.data = c_ref.view().data;
            ref::gemm(gr.M, gr.a, w, BLayout::KN, gr.c, gr.ep);
          }
          EXPECT_LE(norm_err(c_fast, c_ref), 1e-5) << "threads=" << threads << " isa=" << isa_str(isa) << " N=" << sh.N << " K=" << sh.K
                                                   << " rows set " << set;
        }
    }
  }
  set_num_threads(0);
}

// Row counts around the row-block size (at most 160 rows per block, blocks of equal size: 161 ->
// 88 + 73, 321 -> 112 + 112 + 97), K past one K block (200: 192 + a short chunk), both the
// scatter-accumulate (race-free) schedule and plain output rows (dynamic units).
TEST(GroupedGemm, RowBlocksAroundTheBlockSize) {
  const int64_t N = 100, K = 200, rows_out = 53;
  const std::vector<int64_t> Ms = {128, 129, 139, 160, 161, 167, 0, 300, 321, 65};
  int64_t total = 0;
  for (int64_t m : Ms) total += m;
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType t : {DType::bf16, DType::f32}) {
      Tensor x = random_tensor(t, {400, K}, 3), w = random_tensor(t, {N, K}, 6);
      PackedB pw = prepack(w, BLayout::NK);
      std::mt19937 rng(9);
      std::vector<std::vector<int32_t>> gather(Ms.size()), scatter(Ms.size());
      Tensor c_fast = random_tensor(DType::f32, {rows_out, N}, 11), c_ref = Tensor::copy_of(c_fast);
      Tensor p_fast = Tensor::zeros(DType::f32, {total, N}), p_ref = Tensor::zeros(DType::f32, {total, N});
      std::vector<Group> acc(Ms.size()), plain(Ms.size());
      for (size_t g = 0, off = 0; g < Ms.size(); off += size_t(Ms[g]), ++g) {
        for (int64_t i = 0; i < Ms[g]; ++i) {
          gather[g].push_back(int32_t(rng() % 400));
          scatter[g].push_back(int32_t(rng() % rows_out));
        }
        Group& gr = acc[g];
        gr.M = Ms[g];
        gr.a = {x.view().data, t, K, gather[g].data()};
        gr.b = &pw;
        gr.c = {c_fast.view().data, DType::f32, N};
        gr.ep.scatter_rows = scatter[g].data();
        gr.ep.accumulate = true;
        plain[g] = gr;
        plain[g].c = {p_fast.ptr<float>() + off * size_t(N), DType::f32, N};
        plain[g].ep = {};
      }
      grouped_gemm(acc.data(), int64_t(acc.size()));
      grouped_gemm(plain.data(), int64_t(plain.size()));
      for (size_t g = 0; g < Ms.size(); ++g) {
        Group gr = acc[g];
        gr.c.data = c_ref.view().data;
        ref::gemm(gr.M, gr.a, w, BLayout::NK, gr.c, gr.ep);
        gr = plain[g];
        gr.c.data = p_ref.ptr<float>() + (static_cast<const float*>(plain[g].c.data) - p_fast.ptr<float>());
        ref::gemm(gr.M, gr.a, w, BLayout::NK, gr.c, gr.ep);
      }
      EXPECT_LE(norm_err(c_fast, c_ref), 1e-5) << "isa=" << isa_str(isa) << " " << dtype_name(t);
      EXPECT_LE(norm_err(p_fast, p_ref), 1e-5) << "isa=" << isa_str(isa) << " " << dtype_name(t);
    }
  }
}

TEST(GroupedGemm, IndependentOutputsWithSwiglu) {
  const int64_t N = 2 * 70, K = 96;
  const std::vector<int64_t> Ms = {64, 0, 3, 200};
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    std::vector<Tensor> a, w, cf, cr;
    std::vector<PackedB> pw;
    std::vector<Group> groups;
    std::vector<float> bias = to_f32(random_tensor(DType::f32, {N}, 99));
    for (size_t g = 0; g < Ms.size(); ++g) {
      a.push_back(random_tensor(DType::bf16, {std::max<int64_t>(Ms[g], 1), K}, uint32_t(g)));
      w.push_back(random_tensor(DType::bf16, {K, N}, uint32_t(50 + g)));
      pw.push_back(prepack(w.back(), BLayout::KN));
      cf.push_back(Tensor::zeros(DType::bf16, {std::max<int64_t>(Ms[g], 1), N / 2}));
      cr.push_back(Tensor::zeros(DType::bf16, {std::max<int64_t>(Ms[g], 1), N / 2}));
    }
    for (size_t g = 0; g < Ms.size(); ++g) {
      Group gr;
      gr.M = Ms[g];
      gr.a = {a[g].view().data, DType::bf16, K};
      gr.b = &pw[g];
      gr.c = {cf[g].view().data, DType::bf16, N / 2};
      gr.ep.act = Act::swiglu;
      gr.ep.bias = bias.data();
      groups.push_back(gr);
    }
    grouped_gemm(groups.data(), int64_t(groups.size()));
    for (size_t g = 0; g < Ms.size(); ++g) {
      Group gr = groups[g];
      gr.c.data = cr[g].view().data;
      ref::gemm(gr.M, gr.a, w[g], BLayout::KN, gr.c, gr.ep);
      EXPECT_LE(norm_err(cf[g], cr[g]), 1e-2) << "isa=" << isa_str(isa) << " group " << g;
    }
  }
}

// grouped_gemm_chain (an expert FFN: SwiGLU gate/up into h, then h's down GEMM) equals the two
// grouped_gemm calls bit for bit, whatever the thread count: the second stage of a group must wait
// for its own first stage only (no barrier), and sums every output element in the same order.
// Ragged and empty groups, decode-sized groups (1-3 rows), a multi-block group (170 rows); second
// stage scatter-accumulating (race-free column split), into plain rows (dynamic units), and
// scatter-accumulating with a different N per group (the one-thread fallback).
TEST(GroupedGemm, ChainEqualsTwoCallsAndTheReference) {
  const int64_t H = 100, I = 70, rows_out = 31;
  const std::vector<std::vector<int64_t>> row_sets = {{0, 1, 5, 17, 33, 65, 2, 0, 9, 40, 3, 28}, {1, 2, 1, 0, 1, 3}, {170, 0, 12}};
  enum Mode { scatter, plain, ragged_n };
  for (const IsaPath& isa : isa_paths())
    for (int threads : isa >= cpu::Isa::avx512 ? std::vector<int>{1, 2, 3} : std::vector<int>{2}) {
      set_num_threads(threads);
      ScopedIsaPath cap(isa);
      for (Mode mode : {scatter, plain, ragged_n})
        for (size_t set = 0; set < row_sets.size(); ++set) {
          const std::vector<int64_t>& Ms = row_sets[set];
          const size_t G = Ms.size();
          int64_t A = 0;
          for (int64_t m : Ms) A += m;
          Tensor x = random_tensor(DType::bf16, {50, H}, 1);
          std::vector<Tensor> wu, wd;
          std::vector<PackedB> pu, pd;
          std::vector<int64_t> nd(G);
          for (size_t g = 0; g < G; ++g) {
            nd[g] = mode == ragged_n ? H - 16 * int64_t(g % 3) : H;
            wu.push_back(random_tensor(DType::bf16, {H, 2 * I}, uint32_t(20 + g)));
            wd.push_back(random_tensor(DType::bf16, {I, nd[g]}, uint32_t(40 + g)));
            pu.push_back(prepack(wu.back(), BLayout::KN));
            pd.push_back(prepack(wd.back(), BLayout::KN));
          }
          std::mt19937 rng(uint32_t(5 + set));
          std::vector<int32_t> gather, scat;
          std::vector<float> scale;
          for (int64_t i = 0; i < A; ++i) {
            gather.push_back(int32_t(rng() % 50));
            scat.push_back(int32_t(rng() % rows_out));
            scale.push_back(0.5f + float(rng() % 3) * 0.25f);
          }
          const int64_t out_rows = mode == plain ? std::max<int64_t>(A, 1) : rows_out;
          Tensor h1 = Tensor::zeros(DType::bf16, {std::max<int64_t>(A, 1), I}), h2 = Tensor::copy_of(h1);
          Tensor c1 = random_tensor(DType::f32, {out_rows, H}, 7), c2 = Tensor::copy_of(c1), cr = Tensor::copy_of(c1);
          auto groups = [&](Tensor& h, Tensor& c, std::vector<Group>& up, std::vector<Group>& down) {
            up.assign(G, {}), down.assign(G, {});
            for (size_t g = 0, off = 0; g < G; off += size_t(Ms[g]), ++g) {
              char* hp = static_cast<char*>(h.view().data) + off * size_t(I) * 2;
              up[g].M = down[g].M = Ms[g];
              up[g].a = {x.view().data, DType::bf16, H, gather.data() + off};
              up[g].b = &pu[g];
              up[g].c = {hp, DType::bf16, I};
              up[g].ep.act = Act::swiglu;
              down[g].a = {hp, DType::bf16, I};
              down[g].b = &pd[g];
              down[g].ep.row_scale = scale.data() + off;
              down[g].ep.accumulate = true;
              if (mode == plain) {
                down[g].c = {static_cast<char*>(c.view().data) + off * size_t(H) * 4, DType::f32, H};
              } else {
                down[g].c = {c.view().data, DType::f32, H};
                down[g].ep.scatter_rows = scat.data() + off;
              }
            }
          };
          std::vector<Group> up1, down1, up2, down2;
          groups(h1, c1, up1, down1);
          groups(h2, c2, up2, down2);
          grouped_gemm_chain(up1.data(), down1.data(), int64_t(G));
          grouped_gemm(up2.data(), int64_t(G));
          grouped_gemm(down2.data(), int64_t(G));
          const std::string where = "threads=" + std::to_string(threads) + " isa=" + isa_str(isa) + " mode=" + std::to_string(int(mode)) +
                                    " rows set " + std::to_string(set);
          EXPECT_EQ(0, std::memcmp(c1.view().data, c2.view().data, size_t(out_rows * H) * 4)) << where;
          // The reference from the fast path's h (h itself is checked by the SwiGLU tests).
          for (size_t g = 0; g < G; ++g) {
            Group gr = down2[g];
            gr.c.data = static_cast<char*>(cr.view().data) + (static_cast<char*>(gr.c.data) - static_cast<char*>(c2.view().data));
            ref::gemm(gr.M, gr.a, wd[g], BLayout::KN, gr.c, gr.ep);
          }
          EXPECT_LE(norm_err(c2, cr), 1e-5) << where;
        }
    }
  set_num_threads(0);
}

namespace {
// C = alpha * op(A) x op(B) + beta * C for views built from (possibly transposed) storage.
double check_matmul(int64_t M, int64_t N, int64_t K, DType at, DType bt, DType ct, bool ta, bool tb, bool tc, float alpha, float beta,
                    uint32_t seed) {
  Tensor as = ta ? random_tensor(at, {K, M + 2}, seed) : random_tensor(at, {M, K + 3}, seed);
  Tensor bs = tb ? random_tensor(bt, {N, K + 1}, seed + 1) : random_tensor(bt, {K, N + 4}, seed + 1);
  MatView a = ta ? MatView{as.view().data, at, K, M, M + 2, 1}.t() : MatView{as.view().data, at, M, K, K + 3, 1};
  MatView b = tb ? MatView{bs.view().data, bt, N, K, K + 1, 1}.t() : MatView{bs.view().data, bt, K, N, N + 4, 1};
  Tensor c0 = random_tensor(ct, tc ? std::vector<int64_t>{N, M} : std::vector<int64_t>{M, N}, seed + 2);
  Tensor cf = Tensor::copy_of(c0), cr = Tensor::copy_of(c0);
  auto cview = [&](const Tensor& t) { return tc ? MutMatView{t.view().data, ct, M, N, 1, M} : MutMatView{t.view().data, ct, M, N, N, 1}; };
  matmul(a, b, cview(cf), alpha, beta);
  ref::matmul(a, b, cview(cr), alpha, beta);
  return norm_err(cf, cr);
}
}  // namespace

TEST(Matmul, TransposedStridedMixedAlphaBeta) {
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    int i = 0;
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{64, 128, 128}, {64, 64, 128}, {17, 33, 5}, {1, 50, 200}, {255, 16, 15}}) {
      for (DType at : {DType::f32, DType::bf16, DType::f16})
        for (DType bt : {DType::f32, DType::bf16}) {
          ++i;
          bool ta = i % 2, tb = (i / 2) % 2, tc = i % 5 == 0;
          DType ct = i % 3 == 0 ? DType::bf16 : DType::f32;
          float beta = i % 4 == 0 ? 0.f : 0.5f;
          double err = check_matmul(M, N, K, at, bt, ct, ta, tb, tc, 1.5f, beta, uint32_t(i));
          EXPECT_LE(err, tol_for(ct, false)) << "isa=" << isa_str(isa) << " M,N,K=" << M << "," << N << "," << K << " a=" << dtype_name(at)
                                             << " b=" << dtype_name(bt) << " ta=" << ta << " tb=" << tb << " tc=" << tc;
        }
    }
  }
}

TEST(Matmul, EmptyAndZeroK) {
  EXPECT_EQ(check_matmul(0, 5, 7, DType::f32, DType::f32, DType::f32, false, false, false, 1, 0, 1), 0.0);
  EXPECT_LE(check_matmul(6, 5, 0, DType::f32, DType::f32, DType::f32, false, false, false, 1, 0.5f, 1), 1e-6);
  // beta = 0 ignores C even when it holds NaN.
  Tensor a = random_tensor(DType::f32, {3, 4}, 1), b = random_tensor(DType::f32, {4, 5}, 2);
  Tensor c = Tensor::empty(DType::f32, {3, 5});
  for (int64_t i = 0; i < 15; ++i) c.ptr<float>()[i] = NAN;
  matmul(MatView::of(a), MatView::of(b), MutMatView::of(c));
  for (int64_t i = 0; i < 15; ++i) EXPECT_FALSE(std::isnan(c.ptr<float>()[i]));
}

TEST(Matmul, FromInsideParallelRegions) {
  // GDN calls per-chunk matmuls from its own parallel_for: each runs on the calling thread.
  const int chunks = 8;
  std::vector<Tensor> a, b, cf, cr;
  for (int i = 0; i < chunks; ++i) {
    a.push_back(random_tensor(DType::bf16, {64, 128}, uint32_t(i)));
    b.push_back(random_tensor(DType::bf16, {128, 64}, uint32_t(100 + i)));
    cf.push_back(Tensor::zeros(DType::f32, {64, 64}));
    cr.push_back(Tensor::zeros(DType::f32, {64, 64}));
  }
  std::atomic<int> done{0};
  parallel_for(chunks, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      for (int rep = 0; rep < 3; ++rep) matmul(MatView::of(a[i]), MatView::of(b[i]).t().t(), MutMatView::of(cf[i]));
      done++;
    }
  });
  EXPECT_EQ(done.load(), chunks);
  for (int i = 0; i < chunks; ++i) {
    ref::matmul(MatView::of(a[i]), MatView::of(b[i]), MutMatView::of(cr[i]));
    EXPECT_LE(norm_err(cf[i], cr[i]), 2e-5) << i;
  }
}

TEST(Matmul, BadShapesThrow) {
  Tensor a = random_tensor(DType::f32, {3, 4}, 1), b = random_tensor(DType::f32, {5, 6}, 2), c = Tensor::zeros(DType::f32, {3, 6});
  EXPECT_THROW(matmul(MatView::of(a), MatView::of(b), MutMatView::of(c)), Error);
  Tensor b2 = random_tensor(DType::f32, {4, 6}, 2), cbad = Tensor::zeros(DType::f32, {3, 5});
  EXPECT_THROW(matmul(MatView::of(a), MatView::of(b2), MutMatView::of(cbad)), Error);
  Tensor ci = Tensor::zeros(DType::i32, {3, 6});
  EXPECT_THROW(matmul(MatView::of(a), MatView::of(b2), MutMatView::of(ci)), Error);
}

TEST(BulkConvert, VectorMatchesScalar) {
  std::vector<float> src(1000);
  std::mt19937 rng(1);
  for (auto& x : src) x = std::ldexp(float(int(rng() % 20001) - 10000), int(rng() % 40) - 30);
  src[3] = NAN, src[4] = INFINITY, src[5] = -0.f, src[6] = 1e-40f, src[7] = 70000.f;
  for (DType t : {DType::bf16, DType::f16}) {
    for (int64_t n : {0, 1, 15, 16, 17, 1000}) {
      std::vector<uint16_t> v(static_cast<size_t>(n) + 1, 0xdead);
      convert_from_f32(src.data(), v.data(), t, n);
      EXPECT_EQ(v[size_t(n)], 0xdead);  // no write past n
      for (int64_t i = 0; i < n; ++i) {
        uint16_t s = t == DType::bf16 ? f32_to_bf16(src[size_t(i)]) : f32_to_f16(src[size_t(i)]);
        if (std::isnan(src[size_t(i)])) continue;
        ASSERT_EQ(v[size_t(i)], s) << dtype_name(t) << " i=" << i << " x=" << src[size_t(i)];
      }
      std::vector<float> back(static_cast<size_t>(n));
      convert_to_f32(v.data(), t, back.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        float s = t == DType::bf16 ? bf16_to_f32(v[size_t(i)]) : f16_to_f32(v[size_t(i)]);
        if (!std::isnan(s)) { ASSERT_EQ(back[size_t(i)], s); }
      }
    }
  }
}

namespace {
// The arg() of the ot::Error that stmt throws ("" when nothing is thrown).
template <class F> std::string error_arg(F&& stmt) {
  try { stmt(); } catch (const Error& e) { return e.arg(); }
  return "";
}
}  // namespace

// Quantised A (int8 rows + per-row fp32 scale, the EP dispatch's dynamic quantisation) against
// dequantise-then-GEMM in fp32: i8 -> bf16 is exact and the scale is applied to the fp32
// accumulator, so even with bf16 weights the result agrees to fp32 accumulation error.
TEST(GroupedGemm, Int8RowsWithScaleMatchDequantisedGemm) {
  const int64_t K = 130, rows_x = 120;  // >= the 105 rows the groups read in place
  const std::vector<int64_t> Ms = {0, 7, 33, 1, 64};
  std::mt19937 rng(5);
  Tensor q = Tensor::empty(DType::i8, {rows_x, K});
  for (int64_t i = 0; i < q.numel(); ++i) q.ptr<int8_t>()[i] = int8_t(int(rng() % 256) - 128);  // -128..127: every code
  std::vector<float> scale(static_cast<size_t>(rows_x));
  for (auto& s : scale) s = std::ldexp(1.f + float(rng() % 1000) / 1000.f, -int(rng() % 8) - 3);
  Tensor xf = Tensor::empty(DType::f32, {rows_x, K});  // dequantised
  for (int64_t r = 0; r < rows_x; ++r)
    for (int64_t k = 0; k < K; ++k) xf.ptr<float>()[r * K + k] = float(q.ptr<int8_t>()[r * K + k]) * scale[size_t(r)];
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType wt : {DType::bf16, DType::f32}) {
      for (Act act : {Act::none, Act::swiglu}) {
        const int64_t N = 2 * 53, n_out = act == Act::swiglu ? N / 2 : N;
        std::vector<Tensor> w;
        std::vector<PackedB> pw;
        std::vector<std::vector<int32_t>> gather(Ms.size());
        std::vector<float> bias = to_f32(random_tensor(DType::f32, {N}, 17));
        int64_t total = 0;
        for (size_t g = 0; g < Ms.size(); ++g) {
          w.push_back(random_tensor(wt, {N, K}, uint32_t(30 + g)));
          pw.push_back(prepack(w.back(), BLayout::NK));
          for (int64_t i = 0; i < Ms[g]; ++i) gather[g].push_back(int32_t(rng() % rows_x));
          total += Ms[g];
        }
        Tensor cf = Tensor::zeros(DType::f32, {total, n_out}), cr = Tensor::zeros(DType::f32, {total, n_out});
        Tensor cq = Tensor::zeros(DType::f32, {total, n_out});
        std::vector<Group> groups;
        int64_t off = 0;
        for (size_t g = 0; g < Ms.size(); ++g) {
          Group gr;
          gr.M = Ms[g];
          // Odd groups gather through rows (scale indexed by source row), even ones read rows in place.
          if (g % 2) gr.a = {q.view().data, DType::i8, K, gather[g].data(), scale.data()};
          else gr.a = {q.ptr<int8_t>() + off * K, DType::i8, K, nullptr, scale.data() + off};
          gr.b = &pw[g];
          gr.c = {cf.ptr<float>() + off * n_out, DType::f32, n_out};
          gr.ep.act = act;
          gr.ep.bias = bias.data();
          groups.push_back(gr);
          Group rg = gr;  // the same GEMM on the dequantised fp32 rows
          rg.a = g % 2 ? AOperand{xf.view().data, DType::f32, K, gather[g].data()} : AOperand{xf.ptr<float>() + off * K, DType::f32, K};
          rg.c.data = cr.ptr<float>() + off * n_out;
          ref::gemm(rg.M, rg.a, w[g], BLayout::NK, rg.c, rg.ep);
          Group qg = gr;  // the i8 reference (what OT_FORCE_REF runs)
          qg.c.data = cq.ptr<float>() + off * n_out;
          ref::gemm(qg.M, qg.a, w[g], BLayout::NK, qg.c, qg.ep);
          off += Ms[g];
        }
        grouped_gemm(groups.data(), int64_t(groups.size()));
        EXPECT_LE(norm_err(cf, cr), 2e-5) << "isa=" << isa_str(isa) << " w=" << dtype_name(wt) << " act=" << act_name(act);
        EXPECT_LE(norm_err(cq, cr), 1e-6);
      }
    }
  }
}

TEST(GroupedGemm, Int8WithoutScaleAndIntMatmulOperandsAreErrors) {
  Tensor b = random_tensor(DType::bf16, {8, 6}, 1), c = Tensor::zeros(DType::f32, {4, 6});
  Tensor q = Tensor::zeros(DType::i8, {4, 8});
  PackedB pb = prepack(b, BLayout::KN);
  Group g;
  g.M = 4;
  g.a = {q.view().data, DType::i8, 8};
  g.b = &pb;
  g.c = {c.view().data, DType::f32, 6};
  EXPECT_EQ(error_arg([&] { grouped_gemm(&g, 1); }), "a.scale");
  EXPECT_EQ(error_arg([&] { ot::gemm::gemm(4, g.a, pb, g.c); }), "a.scale");
  Tensor ai = Tensor::zeros(DType::i32, {4, 8}), bi = Tensor::zeros(DType::i32, {8, 6}), af = random_tensor(DType::f32, {4, 8}, 2);
  EXPECT_EQ(error_arg([&] { matmul(MatView::of(ai), MatView::of(b), MutMatView::of(c)); }), "a");
  EXPECT_EQ(error_arg([&] { matmul(MatView::of(af), MatView::of(bi), MutMatView::of(c)); }), "b");
  Tensor a8 = Tensor::zeros(DType::i8, {4, 8});
  EXPECT_EQ(error_arg([&] { matmul(MatView::of(a8), MatView::of(b), MutMatView::of(c)); }), "a");  // i8 only with a scale, in the grouped form
  for (int64_t k = 0; k < c.numel(); ++k) ASSERT_EQ(get_as_double(c, k), 0.0);
}

// Packings of 2 MiB and more live on huge-page mappings (length rounded up to whole huge pages when
// that wastes little, else to 4 KiB pages): both forms, moved and destroyed, give the same result.
TEST(PackedB, LargePackingsOnHugePageMappings) {
  const int64_t K = 1024;
  for (int64_t N : {1872 /* 3.7 MiB: rounded to 4 */, 1100 /* 2.2 MiB: page-rounded */, 40 /* heap */}) {
    Tensor w = random_tensor(DType::bf16, {K, N}, uint32_t(N));
    Tensor a = random_tensor(DType::bf16, {5, K}, 3);
    PackedB first = prepack(w, BLayout::KN);
    PackedB pb = std::move(first);  // the mapping moves with the PackedB
    first = prepack(w, BLayout::KN);  // and a moved-from one can be assigned again
    Tensor cf = Tensor::zeros(DType::f32, {5, N}), cr = Tensor::zeros(DType::f32, {5, N});
    ot::gemm::gemm(5, {a.view().data, DType::bf16, K}, pb, {cf.view().data, DType::f32, N});
    ref::gemm(5, {a.view().data, DType::bf16, K}, w, BLayout::KN, {cr.view().data, DType::f32, N});
    EXPECT_LE(norm_err(cf, cr), 1e-5) << "N=" << N;
    EXPECT_EQ(first.bytes(), pb.bytes());
  }
}

}  // namespace test_grouped_matmul
