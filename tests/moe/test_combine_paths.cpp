// The weighted row combine and the streaming row copy (src/moe/common.h) at every ISA cap this CPU
// has (portable, AVX2, AVX-512): combine_rows directly for each input x output dtype pair, H with
// and without whole 64/128-lane blocks and 8/16-lane groups, 0..9 rows (weight 0 included), the
// next output's rows for the prefetch, plain and non-temporal stores; the 8-lane groups bit for bit
// against the portable path's own steps (accumulate_f32, convert_from_f32: the same fp32 fused
// multiply-adds in row order), the rest against fp64; copy_row byte for byte; and unpermute /
// finalize routing (dropped rows, zero weights) against the references.
#include <cstring>

#include "../gemm/gemm_test_util.h"
#include "helpers.h"
#include "ot/cpu.h"
#include "ot/moe.h"
#include "ot/workspace.h"
#include "src/moe/common.h"

namespace test_combine_paths {
using namespace ot;
using namespace ot::moe;
using namespace mt;
using ot::gemm::testing::isa_paths;

namespace {

const std::vector<int64_t>& widths() {
  static const std::vector<int64_t> v{1, 7, 8, 15, 16, 24, 63, 64, 72, 127, 128, 136, 200, 517, 1029, 2048};
  return v;
}

struct Aligned {  // 64-byte aligned bytes, as the non-temporal stores need
  explicit Aligned(size_t n) : p(aligned_alloc64(n)), n(n) { std::memset(p, 0x5a, n); }
  ~Aligned() { aligned_free(p); }
  void* p;
  size_t n;
};

}  // namespace

TEST(MoeCombineRows, EveryDtypePairAndWidthMatchesPortableSteps) {
  for (cpu::Isa isa : isa_paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : float_types())
      for (DType ot_ : float_types())
        for (int64_t H : widths())
          for (int n : {0, 1, 3, 9})
            for (bool stream : {false, true}) {
              std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + "->" + dtype_name(ot_) + " H" + std::to_string(H) +
                                 " n" + std::to_string(n) + (stream ? " stream" : "");
              SCOPED_TRACE(what);
              Tensor src = randn(t, {10, H}, uint32_t(H * 16 + n), 2.f);
              std::vector<impl::WeightedRow> rows;
              for (int j = 0; j < n; ++j)  // rows in scattered order; row 1 with weight 0
                rows.push_back({impl::row_ptr(src.view(), (j * 7) % 10, H), j == 1 ? 0.f : 0.25f * float(j + 1) * (j % 2 ? -1.f : 1.f)});
              impl::WeightedRow next[2] = {{impl::row_ptr(src.view(), 9, H), 1.f}, {impl::row_ptr(src.view(), 8, H), 1.f}};
              const size_t es = dtype_size(ot_);
              Aligned out(size_t(H) * es);
              impl::combine_rows(rows.data(), n, t, H, out.p, ot_, next, 2, stream);
              impl::stream_fence();
              // The portable path's steps (its 8-lane groups use the same FMAs as the vector kernels).
              std::vector<float> acc(size_t(H), 0.f);
              for (int j = 0; j < n; ++j) accumulate_f32(rows[size_t(j)].p, t, rows[size_t(j)].w, acc.data(), H);
              Aligned want(size_t(H) * es);
              convert_from_f32(acc.data(), want.p, ot_, H);
              const int64_t exact = isa == cpu::Isa::scalar ? H : H / 8 * 8;  // the vector tails may fuse where the portable one rounds twice
              ASSERT_EQ(std::memcmp(out.p, want.p, size_t(exact) * es), 0) << "first " << exact << " lanes";
              Tensor o = Tensor::empty(ot_, {H});
              std::memcpy(o.view().data, out.p, size_t(H) * es);
              Tensor r = Tensor::empty(DType::f32, {H});
              for (int64_t h = 0; h < H; ++h) {
                double s = 0;
                for (int j = 0; j < n; ++j) s += double(rows[size_t(j)].w) * get_as_double(src, ((j * 7) % 10) * H + h);
                r.ptr<float>()[h] = float(s);
              }
              EXPECT_LE(nerr(o, r), tol(ot_));  // the inputs are exact in fp64: only the sum and the output rounding err
            }
  }
}

TEST(MoeCombineRows, StreamingCopyIsExact) {
  for (cpu::Isa isa : isa_paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (size_t bytes : {size_t(64), size_t(192), size_t(256), size_t(320), size_t(4096), size_t(4160), size_t(100)})
      for (bool stream : {false, true}) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " bytes " + std::to_string(bytes) + (stream ? " stream" : ""));
        Tensor src = randn(DType::bf16, {3, int64_t(bytes)}, uint32_t(bytes));
        const char* s = static_cast<const char*>(src.view().data) + 3;  // an unaligned source
        Aligned out(bytes);
        impl::copy_row(out.p, s, bytes, stream, s + bytes);
        impl::stream_fence();
        EXPECT_EQ(std::memcmp(out.p, s, bytes), 0);
      }
  }
}

// Through the operators: H not a multiple of 8, 16 or 128, dropped rows (out of range / -1) and zero
// weights, each float dtype.
TEST(MoeCombineRows, UnpermuteAndFinalizeAtEveryCap) {
  for (cpu::Isa isa : isa_paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : float_types())
      for (int64_t H : {5, 67, 136, 333}) {
        const int64_t T = 23, K = 4, E = 8;
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " H" + std::to_string(H));
        Tensor x = randn(t, {T, H}, uint32_t(H));
        Tensor ids = rand_ids(T, K, E, uint32_t(H + 1));
        Tensor probs = randn(DType::f32, {T, K}, uint32_t(H + 2));
        for (int64_t i : {1, 6, 7, 30}) probs.ptr<float>()[i] = 0;
        // Permute keeps 70 of the 92 rows: the rest are dropped (sorted index past the rows).
        TokenPermuteResult p = moe_token_permute(x, ids, 70);
        EXPECT_LE(nerr(moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs),
                       ref::moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs)),
                  tol(t));
        // Finalize in drop/pad mode 3 ([E, C, H] rows, row layout): expanded_row_idx -1 on some pairs
        // (dropped), zero scales on others.
        Tensor ex = randn(t, {4, T, H}, uint32_t(H + 6));
        Tensor idx = Tensor::empty(DType::i32, {T * K});
        for (int64_t i = 0; i < T * K; ++i) idx.ptr<int32_t>()[i] = i % 5 == 0 ? -1 : int32_t((i * 37) % (4 * T));
        Tensor scales = randn(t, {T, K}, uint32_t(H + 3));
        for (int64_t i = 0; i < T * K; i += 7) set_from_double(scales, i, 0.0);
        Tensor skip = randn(t, {T, H}, uint32_t(H + 4));
        Tensor bias = randn(t, {E, H}, uint32_t(H + 5));
        EXPECT_LE(nerr(moe_finalize_routing_v2(ex, idx, skip, skip, bias, scales, ids, 3),
                       ref::moe_finalize_routing_v2(ex, idx, skip, skip, bias, scales, ids, 3)),
                  tol(t));
        EXPECT_LE(nerr(moe_finalize_routing_v2(ex, idx, {}, {}, {}, scales, {}, 3), ref::moe_finalize_routing_v2(ex, idx, {}, {}, {}, scales, {}, 3)),
                  tol(t));
      }
  }
}

}  // namespace test_combine_paths
