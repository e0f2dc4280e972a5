// THE matrix engine: one GEMM for every operator of the library (MoE and GDN, forward and backward).
//
//   C[M,N] (=|+=) epilogue( A[M,K] x B[K,N] )     fp32 accumulation
//
// Two ways to give B:
//   * PackedB: weights packed once by prepack() (from [K,N] or torch-Linear [N,K] storage) into the
//     layout of the micro-kernel chosen at pack time, reused across calls (MoE experts).
//   * MatView: any strided matrix (activations, e.g. GDN's K.K^T, Q.K^T, K^T.V per chunk), packed on
//     the fly. A transposed operand is the same memory with rows/cols and strides swapped, which is
//     how the backward passes get A^T x B.
// Calls made inside a parallel region run on the calling thread only (GDN parallelises over
// (sequence, head) and calls small GEMMs per chunk); calls made outside one use all threads.
#pragma once
#include <cstdint>
#include <memory>

#include "ot/cpu.h"
#include "ot/tensor.h"

namespace ot::gemm {

// A strided matrix: element (i, j) at data + i*rs + j*cs (elements).
struct MatView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 1;
  MatView t() const { return {data, dtype, cols, rows, cs, rs}; }  // transpose, no copy
  static MatView of(const TensorView& v2d);  // 2-D view
};
struct MutMatView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 1;
  static MutMatView of(const TensorView& v2d);
};

enum class BLayout { KN, NK };  // KN: B[k][n]; NK: B stored [N][K] (torch nn.Linear weight)
enum class Act { none, relu, gelu, silu, swiglu };
const char* act_name(Act a);

// Weights packed once. For Act::swiglu the B columns are [gate (N/2) | up (N/2)] and the output
// has N/2 columns: silu(gate) * up.
class PackedB {
 public:
  PackedB();
  ~PackedB();
  PackedB(PackedB&&) noexcept;
  PackedB& operator=(PackedB&&) noexcept;
  int64_t K() const;
  int64_t N() const;
  DType dtype() const;        // dtype of the source weights
  cpu::Isa isa() const;       // micro-kernel family this packing serves
  size_t bytes() const;       // packed size (for bandwidth accounting)
  bool empty() const { return impl_ == nullptr; }
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
  friend PackedB prepack(const TensorView&, BLayout);
};

// b: 2-D view, [K,N] for BLayout::KN or [N,K] for BLayout::NK; bf16, fp16 or fp32.
PackedB prepack(const TensorView& b, BLayout layout);

// A operand: row i of the logical A is at data + (rows ? rows[i] : i) * ld (gather through rows).
// Quantised A (int8 with a per-row scale, e.g. the EP dispatch's dynamic int8 quantisation): dtype
// DType::i8 and scale set; source row r stands for q[r, :] * scale[r] (scale is indexed like data,
// i.e. through rows). The pack converts i8 to bf16/fp32 exactly and the epilogue multiplies the
// accumulator by the row's scale before bias and activation (both halves of a SwiGLU). scale is
// required for i8 and allowed for float A too.
struct AOperand {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t ld = 0;
  const int32_t* rows = nullptr;
  const float* scale = nullptr;  // [source rows], required when dtype == i8
};

// Output and epilogue. Order: acc (* a.scale[row]) -> + bias[n] -> activation -> * row_scale[m] -> store
// (to C row `scatter_rows ? scatter_rows[m] : m`), adding to C instead when accumulate.
struct COperand {
  void* data = nullptr;
  DType dtype = DType::f32;  // f32, bf16 or f16
  int64_t ld = 0;
};
struct Epilogue {
  const float* bias = nullptr;          // [N] (the pre-activation width)
  Act act = Act::none;
  const float* row_scale = nullptr;     // [M]
  const int32_t* scatter_rows = nullptr;  // [M] output row of each A row
  bool accumulate = false;              // C += result (race-free: see grouped_gemm)
};

// C = epilogue(A x B) with M rows.
void gemm(int64_t M, const AOperand& a, const PackedB& b, const COperand& c, const Epilogue& ep = {});

// Many independent GEMMs (MoE experts), balanced over threads with dynamic chunking so groups of
// very different M keep every core busy. When groups scatter-accumulate into the same C rows the
// driver never lets two threads write the same element at the same time.
struct Group {
  int64_t M = 0;
  AOperand a;
  const PackedB* b = nullptr;
  COperand c;
  Epilogue ep;
};
void grouped_gemm(const Group* groups, int64_t count);
// grouped_gemm(first), then grouped_gemm(second), where second[g] may read what first[g] writes (an
// expert's gate/up then its down projection), with no barrier between them: a thread out of
// first-stage work starts on the second stage of the groups whose first stage is done. The same
// results as the two calls (each output element is summed in the same order).
void grouped_gemm_chain(const Group* first, const Group* second, int64_t count);

// General strided form for activations: C = alpha * A x B + beta * C (beta = 0 ignores C's
// contents, so it may hold NaN). A, B: f32/bf16/f16 (A and B may differ); C: f32, bf16 or f16.
void matmul(const MatView& a, const MatView& b, const MutMatView& c, float alpha = 1.f, float beta = 0.f);
// The same product with fp32 operands rounded to bf16 (nearest even) as they are read: bf16 operand
// precision, fp32 accumulation. For the bf16 training paths' small products (GDN's backward per
// chunk, on one thread inside a parallel region), on vdpbf16ps where the GEMM multiplies bf16 with
// it (AVX512-BF16, gemm.bf16_kernel); elsewhere the fp32 product of the rounded operands. a, b, c
// fp32, c with unit column stride; a and b of at most 512 a side.
void matmul_bf16_operands(const MatView& a, const MatView& b, const MutMatView& c, float alpha = 1.f, float beta = 0.f);

// ---- Backward forms (added for the MoE backward; src/gemm/backward_forms*.cpp) -----------------
// They write fp32 C (TN also bf16), with unit column stride; jobs of one call must
// write disjoint C elements. Calls made inside a parallel region run on the calling thread.
//
// NT (activation gradients through a weight): C[M,N] (=|+=) A[M,K] x W^T with W stored row-major
// [N][K] (nn.Linear / the forward's [H, I] gate seen from the I side), given as up to two K
// segments that are summed (e.g. dz = [dz_gate | dz_up] against [Wg | Wu]: K = K0 + K1). W^T is
// packed one 48-column panel at a time into per-thread scratch (vectorised transposing pack), so
// a weight that changes every step is never packed as a whole; A is read in place when it
// already has the kernel's dtype.
struct NtSegment {
  const void* data = nullptr;  // W_s: row n at data + n * ld (elements), K_s contiguous columns
  int64_t K = 0, ld = 0;
};
struct NtJob {
  int64_t M = 0, N = 0;
  AOperand a;            // [M, K0 + K1] (rows may be gathered)
  DType w_dtype = DType::f32;
  NtSegment w[2];        // w[1].K == 0: one segment
  float* c = nullptr;    // [M, N] fp32, row stride ldc
  int64_t ldc = 0;
  bool accumulate = false;
};
void grouped_gemm_nt(const NtJob* jobs, int64_t count);
// NN (the forward on weights that change every step, i.e. training): C[M,N] (=|+=) A x W with W
// stored row-major [K][N] (segment s: row k at w[s].data + k * ld, N contiguous columns; the
// segments are stacked along K). Same jobs, units and panel-at-a-time packing as NT (a bf16 panel
// interleaves two rows per k-pair): the weights are read once, never packed whole.
void grouped_gemm_nn(const NtJob* jobs, int64_t count);

// TN (weight gradients): C[M,N] (=|+=) A^T x B with A [K, M] and B [K, N] given as K rows each
// (K = a group's tokens: often tiny, so there is no K padding beyond a pair). A^T and B are packed
// once per job (a job whose A is the previous job's -- same a, lda, K, M and dtypes -- reuses
// its packed A^T: put such jobs next to each other, e.g. x^T for dW_gate and dW_up); C tiles are
// written with streaming stores when not accumulating. C is fp32 or bf16 (rounded to nearest
// even once, from the fp32 sum; with accumulate, c + sum is rounded).
struct TnJob {
  int64_t K = 0, M = 0, N = 0;
  const void* a = nullptr;  // row k at a + k * lda, M contiguous columns
  const void* b = nullptr;  // row k at b + k * ldb, N contiguous columns
  DType a_dtype = DType::f32, b_dtype = DType::f32;
  int64_t lda = 0, ldb = 0;
  void* c = nullptr;  // [M, N] in c_dtype, row stride ldc
  int64_t ldc = 0;
  bool accumulate = false;
  DType c_dtype = DType::f32;  // f32 or bf16 (bf16: nearest even; the AVX512-BF16 path flushes results below 1.2e-38 to 0)
};
void grouped_gemm_tn(const TnJob* jobs, int64_t count);

// Name of the kernel the engine would use for these operand dtypes now (for logs and benchmarks).
const char* kernel_name(DType a, DType b, int64_t M);

// The plain reference (triple loop, fp64 accumulation) used by tests and `ot bench`.
namespace ref {
void gemm(int64_t M, const AOperand& a, const TensorView& b, BLayout layout, const COperand& c, const Epilogue& ep = {});
void matmul(const MatView& a, const MatView& b, const MutMatView& c, float alpha = 1.f, float beta = 0.f);
}  // namespace ref

}  // namespace ot::gemm
