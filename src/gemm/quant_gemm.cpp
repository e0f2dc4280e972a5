// Quantised grouped GEMM (ot/gemm_quant.h): prepack into the panels of quant_internal.h, the kernel
// table, and the driver (activations to fp32 once, then (expert, panel unit) work items over threads).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ot/error.h"
#include "ot/gemm_quant.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/core/knobs.h"
#include "src/gemm/internal.h"
#include "src/gemm/quant_internal.h"

namespace ot::gemm {

using namespace qdetail;

PackedQuantB::PackedQuantB() = default;
PackedQuantB::~PackedQuantB() = default;
PackedQuantB::PackedQuantB(PackedQuantB&&) noexcept = default;
PackedQuantB& PackedQuantB::operator=(PackedQuantB&&) noexcept = default;
int64_t PackedQuantB::G() const { return impl_ ? impl_->G : 0; }
int64_t PackedQuantB::K() const { return impl_ ? impl_->K : 0; }
int64_t PackedQuantB::N() const { return impl_ ? impl_->N : 0; }
WeightFormat PackedQuantB::format() const { return impl_ ? impl_->format : WeightFormat::int8; }
int64_t PackedQuantB::group_size() const { return impl_ ? impl_->group_size : 0; }
bool PackedQuantB::has_offset() const { return impl_ && impl_->offset; }
ActivationQuant PackedQuantB::activation_quant() const { return impl_ ? impl_->aq : ActivationQuant::none; }
size_t PackedQuantB::expert_bytes() const { return impl_ ? impl_->panel_bytes * size_t(impl_->npanels) : 0; }
size_t PackedQuantB::bytes() const { return impl_ ? expert_bytes() * size_t(impl_->G) : 0; }

namespace {

// int16-activation kernels: software prefetch distance (a per-machine choice: 4096 bytes ran
// 0.86-0.94x the time of 1024 on Zen 5, none 1.10x).
knobs::Knob g_quant_pf("quant.pf", 4096, 0, 8192, "quantised GEMM int16 path: software prefetch this many bytes ahead (0 = none)");
// One-row (and stream_rows) groups: panel units a work item, read as two streams. Zen 5, A/B in one
// process: 4 units 0.67-1.0x the time of 1, 8 no better; two streams 0.87-0.89x of one; multi-row
// groups as streams 0.79-0.94x of row tiles.
constexpr int64_t kStreamUnits = 4;

std::vector<float> f32_copy(const TensorView& v) {
  std::vector<float> out(size_t(v.numel()));
  if (!out.empty()) copy_into(v, TensorView(out.data(), DType::f32, v.shape()));
  return out;
}

// The kernel table: the first row whose ISA is active and whose format matches.
const QKernel kTable[] = {
    {cpu::Isa::avx512, WeightFormat::int8, qkernel_avx2_int8, 1, qdequant_avx2_int8, qtile_avx2, 3, qkernel_avx512vnni_int8_i16, qact_i16_avx512, 8, 4, true,
     "avx512vnni_w8"},
    {cpu::Isa::avx512, WeightFormat::int4, qkernel_avx2_int4, 1, qdequant_avx2_int4, qtile_avx2, 3, qkernel_avx512vnni_int4_i16, qact_i16_avx512, 4, 2, true,
     "avx512vnni_w4"},
    {cpu::Isa::avx2, WeightFormat::int8, qkernel_avx2_int8, 1, qdequant_avx2_int8, qtile_avx2, 3, qkernel_avx2_int8_i16, qact_i16_avx2, 1, 1, false, "avx2_w8"},
    {cpu::Isa::avx2, WeightFormat::int4, qkernel_avx2_int4, 1, qdequant_avx2_int4, qtile_avx2, 3, qkernel_avx2_int4_i16, qact_i16_avx2, 1, 1, false, "avx2_w4"},
    {cpu::Isa::scalar, WeightFormat::int8, qkernel_scalar_int8, 4, qdequant_scalar_int8, qtile_scalar, 4, nullptr, nullptr, 0, 1, false, "scalar_w8"},
    {cpu::Isa::scalar, WeightFormat::int4, qkernel_scalar_int4, 4, qdequant_scalar_int4, qtile_scalar, 4, nullptr, nullptr, 0, 1, false, "scalar_w4"},
};

void epilogue(const detail::EpiArgs& e, const detail::EpiBlock& b) {
  if (cpu::has(cpu::Isa::avx512)) detail::epilogue_avx512(e, b);
  else if (cpu::has(cpu::Isa::avx2)) detail::epilogue_avx2(e, b);
  else detail::epilogue_scalar(e, b);
}

}  // namespace

namespace qdetail {
void finish_unit(const PackedQuantB::Impl& im, const QuantGroup& g, int64_t unit, int64_t rows, const float* t0, const float* t1) {
  detail::EpiArgs e;
  e.bias = g.bias;
  e.act = g.act;
  e.c = g.c.data;
  e.c_dtype = g.c.dtype;
  e.ldc = g.c.ld;
  detail::EpiBlock blk;
  blk.m0 = 0;
  blk.rows = int(rows);
  blk.ldt = kQNR;
  int64_t col0;
  int width;
  if (g.act == Act::swiglu) {  // gate tile 0, up tile 1: output columns of the gate half
    im.cols(unit * 2, &col0, &width);
    blk.t = t0;
    blk.u = t1;
    blk.col0 = col0;
    blk.bcol = col0;
    blk.ucol = col0 + im.N / 2;
    blk.width = width;
    epilogue(e, blk);
    return;
  }
  const int64_t per_unit = im.split ? 2 : 1;
  for (int64_t q = 0; q < per_unit; ++q) {
    im.cols(unit * per_unit + q, &col0, &width);
    blk.t = q ? t1 : t0;
    blk.col0 = col0;
    blk.bcol = col0;
    blk.width = width;
    epilogue(e, blk);
  }
}

const QKernel& select_qkernel(WeightFormat f) {
  for (const QKernel& k : kTable)
    if (k.format == f && cpu::has(k.isa) && (!k.vnni || cpu::features().avx512_vnni)) return k;
  throw Error("grouped_gemm_quant", "format", "int8 or int4", weight_format_name(f));
}
}  // namespace qdetail

const char* quant_kernel_name(WeightFormat f, ActivationQuant a) {
  if (cpu::force_ref()) return "ref";
  return a == ActivationQuant::int8_per_token ? select_qkernel_a8().name : select_qkernel(f).name;
}

PackedQuantB prepack_quantized(const QuantWeightView& w, ActivationQuant activations) {
  const char* op = "prepack_quantized";
  const QuantShape sh = quant_weight_shape(op, w);
  const bool a8 = activations == ActivationQuant::int8_per_token;
  OT_CHECK(!a8 || w.format == WeightFormat::int8, op, "weight", "int8 codes for int8 activations (W8A8)", weight_format_name(w.format));
  OT_CHECK(!a8 || sh.group_len <= 65536, op, "weight", "K groups of at most 65536 rows for int8 activations (int32 sums)", sh.group_len);
  PackedQuantB out;
  out.impl_ = std::make_unique<PackedQuantB::Impl>();
  PackedQuantB::Impl& im = *out.impl_;
  im.G = sh.G, im.K = sh.K, im.N = sh.N, im.groups = sh.groups, im.len = sh.group_len;
  im.format = w.format, im.group_size = w.group_size, im.offset = w.offset.defined(), im.aq = activations;
  im.split = sh.N >= 2 && sh.N % 2 == 0;
  const int64_t span = im.split ? sh.N / 2 : sh.N;
  im.npanels = (span + kQNR - 1) / kQNR * (im.split ? 2 : 1);
  const size_t gb = a8 ? a8_group_bytes(im.len) : group_bytes(w.format, im.len);
  im.panel_bytes = size_t(im.groups) * gb;
  im.mem = detail::WeightMem(std::max<size_t>(im.panel_bytes * size_t(im.npanels * im.G), 64));
  const std::vector<float> s = f32_copy(w.scale), o = im.offset ? f32_copy(w.offset) : std::vector<float>();
  const bool i4 = w.format == WeightFormat::int4;
  const TensorView& q = w.data;
  const char* qd = static_cast<const char*>(q.data);
  parallel_for(im.G * im.npanels, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t g = u / im.npanels, p = u % im.npanels;
      int64_t col0;
      int width;
      im.cols(p, &col0, &width);
      char* dst = const_cast<char*>(im.panel(g, p));
      for (int64_t j = 0; j < im.groups; ++j) {
        float* hs = reinterpret_cast<float*>(dst);
        for (int c = 0; c < kQNR; ++c) {
          const size_t si = size_t((g * im.groups + j) * im.N + col0 + c);
          const float sc = c < width ? s[si] : 0.f, off = c < width && im.offset ? o[si] : 0.f;
          hs[c] = sc;
          hs[kQNR + c] = i4 ? (off - 8.f) * sc : off * sc;  // int4 codes are stored as q + 8
        }
        unsigned char* codes = reinterpret_cast<unsigned char*>(dst + kQHeader);
        std::fill(codes, codes + (gb - kQHeader), a8 ? 128 : 0);  // code 0 everywhere (W8A8 stores q + 128)
        if (a8) {
          for (int64_t kk = 0; kk < im.len; ++kk) {
            const int64_t k = j * im.len + kk;
            unsigned char* quad = codes + size_t(kk / kA8Quad) * kA8QuadBytes;
            for (int c = 0; c < width; ++c)
              quad[a8_code_byte(int(kk % kA8Quad), c)] =
                  static_cast<unsigned char>(static_cast<unsigned char>(qd[g * q.stride(0) + k * q.stride(1) + (col0 + c) * q.stride(2)]) ^ 0x80u);
          }
          dst += gb;
          continue;
        }
        for (int64_t kk = 0; kk < im.len; ++kk) {
          const int64_t k = j * im.len + kk;
          unsigned char* pair = codes + size_t(kk / 2) * pair_bytes(w.format);
          for (int c = 0; c < width; ++c) {
            const int64_t n = col0 + c;
            size_t byte;
            int shift;
            code_position(i4, int(kk % 2), c, &byte, &shift);
            if (!i4) {
              pair[byte] = static_cast<unsigned char>(qd[g * q.stride(0) + k * q.stride(1) + n * q.stride(2)]);
            } else {
              const unsigned b = static_cast<unsigned char>(qd[g * q.stride(0) + k * q.stride(1) + (n / 2) * q.stride(2)]);
              const unsigned nib = (b >> (4 * (n & 1))) & 0xFu, u4 = (nib ^ 8u);  // two's complement q -> q + 8
              pair[byte] = static_cast<unsigned char>(pair[byte] | (u4 << shift));
            }
          }
        }
        dst += gb;
      }
    }
  });
  return out;
}

void grouped_gemm_quant(const PackedQuantB& b, const QuantGroup* groups, int64_t count) {
  const char* op = "grouped_gemm_quant";
  OT_CHECK(!b.empty(), op, "b", "prepacked quantised weights", "empty PackedQuantB");
  const PackedQuantB::Impl& im = *b.impl();
  const int64_t K = im.K, N = im.N;
  std::vector<int64_t> row0(size_t(count) + 1, 0);
  for (int64_t i = 0; i < count; ++i) {
    const QuantGroup& g = groups[i];
    OT_CHECK(g.M >= 0, op, "M", ">= 0", g.M);
    OT_CHECK(g.expert >= 0 && g.expert < im.G, op, "expert", ot::detail::cat("in [0, ", im.G, ")"), g.expert);
    const bool a8 = im.aq == ActivationQuant::int8_per_token;
    OT_CHECK(is_float(g.a_dtype) || (a8 && g.a_dtype == DType::i8), op, "a", a8 ? "bf16, fp16, fp32 or int8 (with a_scale)" : "bf16, fp16 or fp32",
             dtype_name(g.a_dtype));
    OT_CHECK(g.a_dtype != DType::i8 || g.M == 0 || g.a_scale != nullptr, op, "a_scale", "per-row scales for int8 activations", "null");
    OT_CHECK(g.c.dtype == DType::f32 || g.c.dtype == DType::bf16 || g.c.dtype == DType::f16, op, "c", "fp32, bf16 or fp16 output",
             dtype_name(g.c.dtype));
    OT_CHECK(g.act != Act::swiglu || N % 2 == 0, op, "b", "an even N ([gate | up]) for swiglu", N);
    OT_CHECK(g.M == 0 || g.lda >= K, op, "lda", ot::detail::cat(">= K = ", K), g.lda);
    row0[size_t(i) + 1] = row0[size_t(i)] + g.M;
  }
  const int64_t rows = row0[size_t(count)];
  if (im.aq == ActivationQuant::int8_per_token) {
    grouped_gemm_a8(im, groups, count, row0.data());
    return;
  }
  if (rows == 0 || N == 0) return;
  const QKernel& kern = select_qkernel(im.format);
  // Activations as fp32 rows and their per-group sums (the offset term), once per call. A group
  // with bf16 / fp16 activations also gets them as int16 blocks when the kernel takes them (AVX2:
  // one-row groups only; quant_internal.h); its sums are then those of the rounded values.
  const int64_t nb = act_blocks(im.len), lenp = nb * kQABlock;
  auto int16_row = [&](int64_t i) {
    return kern.fn_i16 && (groups[i].M == 1 || kern.i16_mr > 1) && groups[i].a_dtype != DType::f32;
  };
  bool any_i16 = false, any_f32 = false;
  for (int64_t i = 0; i < count; ++i) (int16_row(i) ? any_i16 : any_f32) = true;
  // Grow-only buffers of the calling thread: fresh pages each call cost more than the conversion
  // (page faults under virtualisation: a T 512 qwen3 layer's 48 MB took longer than its GEMMs).
  struct Buffers {
    detail::Buf a32, asum, ascale, a16;
  };
  thread_local Buffers buf;
  float* a32 = any_f32 ? reinterpret_cast<float*>(buf.a32.get(size_t(rows * K) * sizeof(float))) : nullptr;
  float* asum = reinterpret_cast<float*>(buf.asum.get(size_t(rows * im.groups) * sizeof(float)));
  float* ascale = any_i16 ? reinterpret_cast<float*>(buf.ascale.get(size_t(rows * im.groups * nb) * sizeof(float))) : nullptr;
  int16_t* a16 = any_i16 ? reinterpret_cast<int16_t*>(buf.a16.get(size_t(rows * im.groups * lenp) * sizeof(int16_t))) : nullptr;
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> row_f32;  // an int16 row's fp32 form (only the blocks keep it)
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t i = int64_t(std::upper_bound(row0.begin(), row0.end(), row) - row0.begin()) - 1, r = row - row0[size_t(i)];
      const bool i16 = int16_row(i);
      if (i16) row_f32.resize(size_t(K));
      float* dst = i16 ? row_f32.data() : a32 + row * K;
      const int64_t src = groups[i].a_rows ? groups[i].a_rows[r] : r;
      convert_to_f32(static_cast<const char*>(groups[i].a) + size_t(src * groups[i].lda) * dtype_size(groups[i].a_dtype), groups[i].a_dtype, dst, K);
      for (int64_t j = 0; j < im.groups; ++j) {
        float acc = 0;
        if (i16) {
          acc = kern.act_i16(dst + j * im.len, im.len, a16 + (row * im.groups + j) * lenp, ascale + (row * im.groups + j) * nb);
        } else {
          for (int64_t k = 0; k < im.len; ++k) acc += dst[j * im.len + k];
        }
        asum[size_t(row * im.groups + j)] = acc;
      }
    }
  });
  // Work items: (group, first unit, units); a unit is a gate/up panel pair when the halves
  // interleave. One-row groups on the int16 kernels take several units an item, read as two long
  // streams (the item's first half of panels beside its second half), as the bf16 decode tile does.
  const int64_t per_unit = im.split ? 2 : 1, units_per_group = im.npanels / per_unit;
  const size_t gbytes = group_bytes(im.format, im.len);
  // Groups read as item streams: one row, or up to the kernel's stream_rows on int16 activations.
  auto streamed = [&](int64_t i) { return groups[i].M == 1 || (int16_row(i) && groups[i].M <= kern.stream_rows); };
  struct Item {
    int64_t group, unit0, units;
  };
  std::vector<Item> items;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t step = streamed(i) && int16_row(i) ? kStreamUnits : 1;
    if (groups[i].M > 0)
      for (int64_t u = 0; u < units_per_group; u += step) items.push_back({i, u, std::min(step, units_per_group - u)});
  }
  const int64_t pf = g_quant_pf.get();
  parallel_for_dynamic(int64_t(items.size()), 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float tile[2 * kStreamUnits][kQNR];
    alignas(64) float wblk[kQKC * kQNR];
    thread_local std::vector<float> acc;  // several rows' tiles (grow-only: an item is a chunk)
    for (int64_t it = b0; it < b1; ++it) {
      const Item& w = items[size_t(it)];
      const int64_t i = w.group;
      const QuantGroup& g = groups[i];
      const float* a = a32 ? a32 + row0[size_t(i)] * K : nullptr;  // (fp32 paths only)
      const float* as = asum + row0[size_t(i)] * im.groups;
      const int64_t row = row0[size_t(i)];
      QI16Args ar{};
      ar.lda = im.groups * lenp, ar.ldsc = im.groups * nb, ar.ldas = im.groups;
      ar.groups = im.groups, ar.len = im.len, ar.pf = pf;
      auto rows_at = [&](int64_t m0, int64_t h) {
        ar.rows = int(h);
        ar.a16 = a16 + (row + m0) * ar.lda, ar.ascale = ascale + (row + m0) * ar.ldsc, ar.asum = as + m0 * im.groups;
      };
      auto finish = [&](int64_t unit, int64_t rows, const float* t0, const float* t1) { finish_unit(im, g, unit, rows, t0, t1); };
      if (streamed(i)) {
        // The item's panels into out [np][M][32]; int16 activations by the panel pairs (q, q + h).
        const int64_t np = w.units * per_unit, h = int16_row(i) ? np / 2 : 0, pstride = g.M * kQNR;
        float* out = tile[0];
        if (g.M > 1) {
          acc.resize(size_t(np * pstride));
          out = acc.data();
        }
        const char* p0 = im.panel(g.expert, w.unit0 * per_unit);
        if (int16_row(i)) {
          rows_at(0, g.M);
          ar.panel_step = size_t(h) * im.panel_bytes, ar.ldcp = h * pstride, ar.panels = 2;
          for (int64_t q = 0; q < h; ++q) {
            ar.panel = p0 + size_t(q) * im.panel_bytes, ar.c = out + q * pstride;
            kern.fn_i16(ar);
          }
          ar.panels = 1;
          for (int64_t q = 2 * h; q < np; ++q) {
            ar.panel = p0 + size_t(q) * im.panel_bytes, ar.c = out + q * pstride;
            kern.fn_i16(ar);
          }
        } else {
          for (int64_t q = 0; q < np; ++q) kern.fn(1, a, K, as, im.groups, p0 + size_t(q) * im.panel_bytes, im.groups, im.len, out + q * pstride);
        }
        for (int64_t u = 0; u < w.units; ++u) finish(w.unit0 + u, g.M, out + u * per_unit * pstride, out + (u * per_unit + per_unit - 1) * pstride);
        continue;
      }
      // Several rows (one unit an item) into acc [per_unit][M][32]: int16 activations by the
      // kernel's row tiles over the whole K; fp32 by chunks of K dequantised once into an L1 block
      // that all row tiles reuse. Balanced tile heights (4 rows: 2 + 2, not 3 + 1: a one-row tile
      // is latency bound).
      const int64_t unit = w.unit0;
      acc.resize(size_t(per_unit * g.M * kQNR));
      float* accp = acc.data();
      auto row_tiles = [&](int64_t mr, auto&& f) {
        const int64_t ntiles = (g.M + mr - 1) / mr;
        for (int64_t t = 0, m0 = 0; m0 < g.M; ++t) {
          const int64_t hgt = (g.M - m0 + (ntiles - t) - 1) / (ntiles - t);
          f(m0, hgt);
          m0 += hgt;
        }
      };
      if (int16_row(i)) {
        ar.panels = 1, ar.ldcp = 0;
        for (int64_t q = 0; q < per_unit; ++q)
          row_tiles(kern.i16_mr, [&](int64_t m0, int64_t hgt) {
            rows_at(m0, hgt);
            ar.panel = im.panel(g.expert, unit * per_unit + q), ar.c = accp + (q * g.M + m0) * kQNR;
            kern.fn_i16(ar);
          });
      } else {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t q = 0; q < per_unit; ++q) {
          const char* panel = im.panel(g.expert, unit * per_unit + q);
          for (int64_t j = 0; j < im.groups; ++j, panel += gbytes)
            for (int64_t k0 = 0; k0 < im.len; k0 += kQKC) {
              const int64_t kc = std::min<int64_t>(kQKC, im.len - k0);
              kern.dequant(panel, k0, kc, wblk);
              row_tiles(kern.tile_mr, [&](int64_t m0, int64_t hgt) {
                kern.tile(int(hgt), kc, a + m0 * K + j * im.len + k0, K, wblk, accp + (q * g.M + m0) * kQNR);
              });
            }
        }
      }
      finish(unit, g.M, accp, accp + (per_unit - 1) * g.M * kQNR);
    }
  });
}

}  // namespace ot::gemm
