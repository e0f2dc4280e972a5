// causal_conv1d_fn and causal_conv1d_bwd (ot/gdn_layer.h): argument checks, then one job per
// (sequence, channel block) forward and one per channel block backward (each owns its dweight /
// dbias accumulators and visits the sequences in order: deterministic), on the ISA's kernels.
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/gdn_layer.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
#include "src/gdn/causal_conv1d_args.h"
#include "src/gdn/gdn_internal.h"
#include "src/ref/gdn_layer_ref.h"

namespace ot::gdn {
using namespace detail;
using namespace detail::conv;

namespace {

struct ConvArgs {
  int64_t B = 0, T = 0, D = 0, W = 0, N = 0;
  SeqInfo seq;
  bool silu = true;
};

ConvArgs check_fn(const TensorView& x, const TensorView& weight, const CausalConv1dOptions& o, const char* op) {
  ConvArgs a;
  OT_CHECK(x.defined() && x.ndim == 3, op, "x", "[B, T, D] (packed varlen: [1, T_total, D])", x.shape_str());
  expect_float(x.dtype, op, "x");
  a.B = x.sizes[0], a.T = x.sizes[1], a.D = x.sizes[2];
  a.W = check_weight_bias(weight, o.bias, a.D, op);
  OT_CHECK(o.activation == Activation::none || o.activation == Activation::silu, op, "activation", "none or silu", int(o.activation));
  a.silu = o.activation == Activation::silu;
  a.seq = make_seq_info(a.B, a.T, o.cu_seqlens, op);
  a.N = a.seq.num_seqs();
  if (o.initial_states.defined()) check_state(o.initial_states, a.N, a.D, a.W, x.dtype, op, "initial_states");
  return a;
}

// The channel-contiguous form the kernels read (a copy only when the channel stride is not 1).
TensorView channels_contiguous(const TensorView& v, Tensor& keep) {
  if (v.strides[2] == 1 || v.sizes[2] <= 1) return v;
  keep = Tensor::copy_of(v);
  return keep.view();
}
// Sequence n's tokens of v from channel c0 on.
char* seq_at(const TensorView& v, const ConvArgs& a, int64_t n, int64_t c0) {
  return elem_at(v.data, v.dtype, a.seq.row[size_t(n)] * v.strides[0] + a.seq.bos[size_t(n)] * v.strides[1] + c0);
}
Rows rows_of(const TensorView& v, const ConvArgs& a, int64_t n, int64_t c0) { return {seq_at(v, a, n, c0), v.dtype, v.strides[1]}; }
OutRows out_rows_of(const TensorView& v, const ConvArgs& a, int64_t n, int64_t c0) { return {seq_at(v, a, n, c0), v.dtype, v.strides[1]}; }
// A forward or backward job of sequence n, channel block b at c0: its input rows, its length and
// (when given) its initial state, gathered into init_buf.
template <class Seq>
Seq seq_job(const ConvArgs& a, int64_t n, int64_t c0, const Block& b, const TensorView& x, const TensorView& init, float* init_buf) {
  Seq s;
  s.x = rows_of(x, a, n, c0);
  s.len = a.seq.len[size_t(n)];
  if (init.defined()) {
    gather_state(init, n, c0, b.nc, a.W, init_buf);
    s.init = init_buf;
  }
  return s;
}
std::vector<int64_t> seq_starts(const ConvArgs& a, const CausalConv1dOptions& o) {
  if (!o.cu_seqlens.defined()) return {};
  std::vector<int64_t> s(a.seq.bos.begin(), a.seq.bos.end());
  s.push_back(a.T);
  return s;
}

const cpu::KernelEntry<SeqKernels, cpu::AnyPlan> kSeqKernels[] = {
    {cpu::Isa::avx2, nullptr, {avx2::fwd_seq, avx2::bwd_seq}, "avx2"},
    {cpu::Isa::scalar, nullptr, {generic::fwd_seq, generic::bwd_seq}, "generic"},
};

}  // namespace

const cpu::KernelEntry<SeqKernels, cpu::AnyPlan>& detail::conv::seq_kernels() { return cpu::select_kernel("causal_conv1d", kSeqKernels); }

CausalConv1dOut causal_conv1d_fn(const TensorView& x_in, const TensorView& weight, const CausalConv1dOptions& o) {
  const char* op = "causal_conv1d_fn";
  trace::OpScope scope(op);
  ConvArgs a = check_fn(x_in, weight, o, op);
  CausalConv1dOut r;
  r.y = pooled_empty(x_in.dtype, {a.B, a.T, a.D});
  if (o.return_final_states) r.final_states = Tensor::empty(x_in.dtype, {a.N, a.D, a.W - 1});
  const bool use_ref = cpu::force_ref();
  const auto& kernels = seq_kernels();
  if (scope.active()) scope.args(x_in.shape_str()).kernel(use_ref ? "ref" : kernels.name);
  if (use_ref) {
    ref::causal_conv1d_fwd(x_in, weight, o.bias, o.initial_states, a.silu, seq_starts(a, o), r.y, r.final_states.view());
    return r;
  }
  Tensor keep;
  const TensorView x = channels_contiguous(x_in, keep);
  const PackedWeights pw = pack_weights(weight, o.bias);
  const TensorView y = r.y.view(), fin = r.final_states.view(), init = o.initial_states;
  parallel_for(a.N * pw.blocks, [&](int64_t j0, int64_t j1) {
    alignas(64) float init_buf[kMaxWidth * kBlock], fin_buf[kMaxWidth * kBlock];
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t n = j / pw.blocks, blk = j % pw.blocks, c0 = blk * kBlock;
      const Block b = pw.block(blk, a.silu);
      FwdSeq s = seq_job<FwdSeq>(a, n, c0, b, x, init, init_buf);
      s.y = out_rows_of(y, a, n, c0);
      if (fin.defined()) s.fin = fin_buf;
      kernels.fn.fwd_seq(b, s);
      if (fin.defined()) scatter_state(fin_buf, fin, n, c0, b.nc, a.W);
    }
  });
  return r;
}

CausalConv1dGrads causal_conv1d_bwd(const TensorView& x_in, const TensorView& weight, const TensorView& dy_in,
                                    const CausalConv1dOptions& o, const TensorView& dfinal_states) {
  const char* op = "causal_conv1d_bwd";
  trace::OpScope scope(op);
  ConvArgs a = check_fn(x_in, weight, o, op);
  OT_CHECK(dy_in.defined() && dy_in.shape() == x_in.shape(), op, "dy", ::ot::detail::cat("the shape of x ", x_in.shape_str()),
           dy_in.shape_str());
  expect_float(dy_in.dtype, op, "dy");
  if (dfinal_states.defined()) check_state(dfinal_states, a.N, a.D, a.W, x_in.dtype, op, "dfinal_states", true);
  CausalConv1dGrads g;
  g.dx = pooled_empty(x_in.dtype, {a.B, a.T, a.D});
  g.dweight = Tensor::empty(DType::f32, {a.D, a.W});
  if (o.bias.defined()) g.dbias = Tensor::empty(DType::f32, {a.D});
  if (o.initial_states.defined()) g.dinitial_states = Tensor::empty(o.initial_states.dtype, {a.N, a.D, a.W - 1});
  const bool use_ref = cpu::force_ref();
  const auto& kernels = seq_kernels();
  if (scope.active()) scope.args(x_in.shape_str()).kernel(use_ref ? "ref" : kernels.name);
  if (use_ref) {
    ref::causal_conv1d_bwd(x_in, weight, o.bias, o.initial_states, a.silu, seq_starts(a, o), dy_in, dfinal_states, g.dx, g.dweight,
                           g.dbias.view(), g.dinitial_states.view());
    return g;
  }
  Tensor keep_x, keep_dy;
  const TensorView x = channels_contiguous(x_in, keep_x), dy = channels_contiguous(dy_in, keep_dy);
  const PackedWeights pw = pack_weights(weight, o.bias);
  const TensorView dx = g.dx.view(), init = o.initial_states, dinit = g.dinitial_states.view();
  float* dweight = g.dweight.ptr<float>();
  float* dbias = g.dbias.defined() ? g.dbias.ptr<float>() : nullptr;
  parallel_for(pw.blocks, [&](int64_t b0, int64_t b1) {
    alignas(64) float init_buf[kMaxWidth * kBlock], dfin_buf[kMaxWidth * kBlock], dinit_buf[kMaxWidth * kBlock];
    alignas(64) float dw[kMaxWidth * kBlock], db[kBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t c0 = blk * kBlock;
      const Block b = pw.block(blk, a.silu);
      std::fill(dw, dw + kMaxWidth * kBlock, 0.f);
      std::fill(db, db + kBlock, 0.f);
      for (int64_t n = 0; n < a.N; ++n) {
        BwdSeq s = seq_job<BwdSeq>(a, n, c0, b, x, init, init_buf);
        s.dy = rows_of(dy, a, n, c0);
        s.dx = out_rows_of(dx, a, n, c0);
        if (init.defined()) s.dinit = dinit_buf;
        if (dfinal_states.defined()) {
          gather_state(dfinal_states, n, c0, b.nc, a.W, dfin_buf);
          s.dfin = dfin_buf;
        }
        s.dw = dw;
        s.db = db;
        kernels.fn.bwd_seq(b, s);
        if (dinit.defined()) scatter_state(dinit_buf, dinit, n, c0, b.nc, a.W);
      }
      for (int64_t c = 0; c < b.nc; ++c) {
        for (int64_t k = 0; k < a.W; ++k) dweight[(c0 + c) * a.W + k] = dw[k * kBlock + c];
        if (dbias) dbias[c0 + c] = db[c];
      }
    }
  });
  return g;
}

}  // namespace ot::gdn
