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

struct PackedQuantB::Impl {
  int64_t G = 0, K = 0, N = 0, groups = 1, len = 0, npanels = 0;
  WeightFormat format = WeightFormat::int8;
  int64_t group_size = 0;
  bool offset = false, split = false;
  size_t panel_bytes = 0;
  detail::WeightMem mem;
  const char* panel(int64_t g, int64_t p) const { return mem.get() + (size_t(g) * size_t(npanels) + size_t(p)) * panel_bytes; }
  // First column of panel p and how many of its 32 columns are real (halves interleaved when split).
  void cols(int64_t p, int64_t* col0, int* width) const {
    const int64_t span = split ? N / 2 : N, i = split ? p >> 1 : p, base = split ? (p & 1) * span : 0;
    *col0 = base + i * kQNR;
    *width = int(std::min<int64_t>(kQNR, span - i * kQNR));
  }
};

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
size_t PackedQuantB::expert_bytes() const { return impl_ ? impl_->panel_bytes * size_t(impl_->npanels) : 0; }
size_t PackedQuantB::bytes() const { return impl_ ? expert_bytes() * size_t(impl_->G) : 0; }

namespace {

// int16-activation kernels (AVX-512 VNNI): software prefetch distance and one or two panel streams
// per thread for one-row groups.
knobs::Knob g_quant_pf("quant.pf", 4096, 0, 8192, "quantised GEMM int16 path: software prefetch this many bytes ahead (0 = none)");
knobs::Knob g_quant_streams("quant.streams", 2, 1, 2, "quantised GEMM, one-row groups: read the gate and up panels side by side (2) or one after the other (1)");

std::vector<float> f32_copy(const TensorView& v) {
  std::vector<float> out(size_t(v.numel()));
  if (!out.empty()) copy_into(v, TensorView(out.data(), DType::f32, v.shape()));
  return out;
}

// The kernel table: the first row whose ISA is active and whose format matches.
const QKernel kTable[] = {
    {cpu::Isa::avx512, WeightFormat::int8, qkernel_avx2_int8, 1, qdequant_avx2_int8, qtile_avx2, 3, qkernel_avx512vnni_int8_i16, 4, true,
     "avx512vnni_w8"},
    {cpu::Isa::avx512, WeightFormat::int4, qkernel_avx2_int4, 1, qdequant_avx2_int4, qtile_avx2, 3, qkernel_avx512vnni_int4_i16, 4, true,
     "avx512vnni_w4"},
    {cpu::Isa::avx2, WeightFormat::int8, qkernel_avx2_int8, 1, qdequant_avx2_int8, qtile_avx2, 3, qkernel_avx2_int8_i16, 1, false, "avx2_w8"},
    {cpu::Isa::avx2, WeightFormat::int4, qkernel_avx2_int4, 1, qdequant_avx2_int4, qtile_avx2, 3, qkernel_avx2_int4_i16, 1, false, "avx2_w4"},
    {cpu::Isa::scalar, WeightFormat::int8, qkernel_scalar_int8, 4, qdequant_scalar_int8, qtile_scalar, 4, nullptr, 0, false, "scalar_w8"},
    {cpu::Isa::scalar, WeightFormat::int4, qkernel_scalar_int4, 4, qdequant_scalar_int4, qtile_scalar, 4, nullptr, 0, false, "scalar_w4"},
};

// a[0, len) as int16 blocks of kQABlock (zero-padded to whole blocks) with scale[b] = max |a| / 32767
// (rounded to nearest even); returns the sum of the rounded values. A block with a NaN or Inf gets
// a NaN scale and zero codes, so the row's outputs are NaN as on the fp32 path.
float round_to_int16_blocks(const float* a, int64_t len, int16_t* q, float* scale) {
  double total = 0;
  for (int64_t k0 = 0, b = 0; k0 < len; k0 += kQABlock, ++b) {
    const int64_t n = std::min<int64_t>(kQABlock, len - k0);
    float amax = 0;
    bool finite = true;
    for (int64_t k = 0; k < n; ++k) {
      finite = finite && std::isfinite(a[k0 + k]);
      amax = std::max(amax, std::fabs(a[k0 + k]));
    }
    const float inv = finite && amax > 0 ? 32767.f / amax : 0.f;
    scale[b] = finite ? amax / 32767.f : std::numeric_limits<float>::quiet_NaN();
    int64_t isum = 0;
    for (int64_t k = 0; k < kQABlock; ++k) {
      const long v = k < n ? std::clamp(std::lrint(a[k0 + k] * inv), -32767l, 32767l) : 0;
      q[k0 + k] = int16_t(v);
      isum += v;
    }
    total += double(isum) * scale[b];
  }
  return float(total);
}

void epilogue(const detail::EpiArgs& e, const detail::EpiBlock& b) {
  if (cpu::has(cpu::Isa::avx512)) detail::epilogue_avx512(e, b);
  else if (cpu::has(cpu::Isa::avx2)) detail::epilogue_avx2(e, b);
  else detail::epilogue_scalar(e, b);
}

}  // namespace

namespace qdetail {
const QKernel& select_qkernel(WeightFormat f) {
  for (const QKernel& k : kTable)
    if (k.format == f && cpu::has(k.isa) && (!k.vnni || cpu::features().avx512_vnni)) return k;
  throw Error("grouped_gemm_quant", "format", "int8 or int4", weight_format_name(f));
}
}  // namespace qdetail

const char* quant_kernel_name(WeightFormat f) { return cpu::force_ref() ? "ref" : select_qkernel(f).name; }

PackedQuantB prepack_quantized(const QuantWeightView& w) {
  const QuantShape sh = quant_weight_shape("prepack_quantized", w);
  PackedQuantB out;
  out.impl_ = std::make_unique<PackedQuantB::Impl>();
  PackedQuantB::Impl& im = *out.impl_;
  im.G = sh.G, im.K = sh.K, im.N = sh.N, im.groups = sh.groups, im.len = sh.group_len;
  im.format = w.format, im.group_size = w.group_size, im.offset = w.offset.defined();
  im.split = sh.N >= 2 && sh.N % 2 == 0;
  const int64_t span = im.split ? sh.N / 2 : sh.N;
  im.npanels = (span + kQNR - 1) / kQNR * (im.split ? 2 : 1);
  im.panel_bytes = size_t(im.groups) * group_bytes(w.format, im.len);
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
        const size_t gb = group_bytes(w.format, im.len);
        std::fill(codes, codes + (gb - kQHeader), 0);
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
    OT_CHECK(is_float(g.a_dtype), op, "a", "bf16, fp16 or fp32", dtype_name(g.a_dtype));
    OT_CHECK(g.c.dtype == DType::f32 || g.c.dtype == DType::bf16 || g.c.dtype == DType::f16, op, "c", "fp32, bf16 or fp16 output",
             dtype_name(g.c.dtype));
    OT_CHECK(g.act != Act::swiglu || N % 2 == 0, op, "b", "an even N ([gate | up]) for swiglu", N);
    OT_CHECK(g.M == 0 || g.lda >= K, op, "lda", ot::detail::cat(">= K = ", K), g.lda);
    row0[size_t(i) + 1] = row0[size_t(i)] + g.M;
  }
  const int64_t rows = row0[size_t(count)];
  if (rows == 0 || N == 0) return;
  const QKernel& kern = select_qkernel(im.format);
  // Activations as fp32 rows and their per-group sums (the offset term), once per call. A group
  // with bf16 / fp16 activations also gets them as int16 blocks when the kernel takes them (AVX2:
  // one-row groups only; quant_internal.h); its sums are then those of the rounded values.
  const int64_t nb = act_blocks(im.len), lenp = nb * kQABlock;
  auto int16_row = [&](int64_t i) {
    return kern.fn_i16 && (groups[i].M == 1 || kern.i16_mr > 1) && groups[i].a_dtype != DType::f32;
  };
  bool any_i16 = false;
  for (int64_t i = 0; i < count; ++i) any_i16 = any_i16 || int16_row(i);
  std::vector<float> a32(size_t(rows * K)), asum(size_t(rows * im.groups)), ascale(any_i16 ? size_t(rows * im.groups * nb) : 0);
  std::vector<int16_t> a16(any_i16 ? size_t(rows * im.groups * lenp) : 0);
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t i = int64_t(std::upper_bound(row0.begin(), row0.end(), row) - row0.begin()) - 1, r = row - row0[size_t(i)];
      float* dst = a32.data() + row * K;
      const int64_t src = groups[i].a_rows ? groups[i].a_rows[r] : r;
      convert_to_f32(static_cast<const char*>(groups[i].a) + size_t(src * groups[i].lda) * dtype_size(groups[i].a_dtype), groups[i].a_dtype, dst, K);
      if (int16_row(i)) {
        for (int64_t j = 0; j < im.groups; ++j)
          asum[size_t(row * im.groups + j)] = round_to_int16_blocks(dst + j * im.len, im.len, a16.data() + (row * im.groups + j) * lenp,
                                                                    ascale.data() + (row * im.groups + j) * nb);
        continue;
      }
      for (int64_t j = 0; j < im.groups; ++j) {
        float acc = 0;
        for (int64_t k = 0; k < im.len; ++k) acc += dst[j * im.len + k];
        asum[size_t(row * im.groups + j)] = acc;
      }
    }
  });
  // Work items: (group, panel unit); a unit is a gate/up panel pair when the halves interleave.
  const int64_t per_unit = im.split ? 2 : 1, units_per_group = im.npanels / per_unit;
  const size_t gbytes = group_bytes(im.format, im.len);
  std::vector<int64_t> items;
  for (int64_t i = 0; i < count; ++i)
    if (groups[i].M > 0)
      for (int64_t u = 0; u < units_per_group; ++u) items.push_back(i * units_per_group + u);
  const int64_t pf = g_quant_pf.get();
  const bool two_streams = g_quant_streams.get() == 2;
  parallel_for_dynamic(int64_t(items.size()), 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float tile[2][4 * kQNR];
    alignas(64) float wblk[kQKC * kQNR];
    std::vector<float> acc;
    for (int64_t it = b0; it < b1; ++it) {
      const int64_t i = items[size_t(it)] / units_per_group, unit = items[size_t(it)] % units_per_group;
      const QuantGroup& g = groups[i];
      detail::EpiArgs e;
      e.bias = g.bias;
      e.act = g.act;
      e.c = g.c.data;
      e.c_dtype = g.c.dtype;
      e.ldc = g.c.ld;
      const float* a = a32.data() + row0[size_t(i)] * K;
      const float* as = asum.data() + row0[size_t(i)] * im.groups;
      // int16 activations: the kernel's row tiles over the whole K (AVX-512 VNNI; AVX2 one row).
      // fp32, one row: codes to fp32 in registers. fp32, more rows: each chunk of K is dequantised
      // once into an L1 block that all row tiles reuse. Several rows accumulate into acc
      // [per_unit][M][32].
      const bool single = g.M == 1;
      const int64_t tile_rows = single ? 1 : g.M;
      float* accp = tile[0];
      if (!single) {
        acc.resize(size_t(per_unit * g.M * kQNR));
        accp = acc.data();
      }
      auto out_of = [&](int64_t q) { return single ? tile[q] : accp + q * g.M * kQNR; };
      // Balanced tile heights (4 rows: 2 + 2, not 3 + 1: a one-row tile is latency bound).
      auto row_tiles = [&](int64_t mr, auto&& f) {
        const int64_t ntiles = (g.M + mr - 1) / mr;
        for (int64_t t = 0, m0 = 0; m0 < g.M; ++t) {
          const int64_t h = (g.M - m0 + (ntiles - t) - 1) / (ntiles - t);
          f(m0, h);
          m0 += h;
        }
      };
      if (int16_row(i)) {
        const int64_t row = row0[size_t(i)];
        QI16Args ar{};
        ar.lda = im.groups * lenp, ar.ldsc = im.groups * nb, ar.ldas = im.groups;
        ar.panel_step = im.panel_bytes, ar.groups = im.groups, ar.len = im.len, ar.pf = pf;
        ar.ldcp = single ? int64_t(tile[1] - tile[0]) : g.M * kQNR;
        auto rows_at = [&](int64_t m0, int64_t h) {
          ar.rows = int(h);
          ar.a16 = a16.data() + (row + m0) * ar.lda, ar.ascale = ascale.data() + (row + m0) * ar.ldsc, ar.asum = as + m0 * im.groups;
        };
        if (single && per_unit == 2 && two_streams) {  // gate and up panels side by side
          rows_at(0, 1);
          ar.panels = 2, ar.panel = im.panel(g.expert, unit * 2), ar.c = out_of(0);
          kern.fn_i16(ar);
        } else {
          for (int64_t q = 0; q < per_unit; ++q)
            row_tiles(kern.i16_mr, [&](int64_t m0, int64_t h) {
              rows_at(m0, h);
              ar.panels = 1, ar.panel = im.panel(g.expert, unit * per_unit + q), ar.c = out_of(q) + m0 * kQNR;
              kern.fn_i16(ar);
            });
        }
      } else if (!single) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t q = 0; q < per_unit; ++q) {
          const char* panel = im.panel(g.expert, unit * per_unit + q);
          for (int64_t j = 0; j < im.groups; ++j, panel += gbytes)
            for (int64_t k0 = 0; k0 < im.len; k0 += kQKC) {
              const int64_t kc = std::min<int64_t>(kQKC, im.len - k0);
              kern.dequant(panel, k0, kc, wblk);
              row_tiles(kern.tile_mr, [&](int64_t m0, int64_t h) {
                kern.tile(int(h), kc, a + m0 * K + j * im.len + k0, K, wblk, out_of(q) + m0 * kQNR);
              });
            }
        }
      } else {
        for (int64_t q = 0; q < per_unit; ++q)
          kern.fn(1, a, K, as, im.groups, im.panel(g.expert, unit * per_unit + q), im.groups, im.len, tile[q]);
      }
      {
        const int64_t m0 = 0;
        const int rows_t = int(tile_rows);
        float* t0 = accp;
        float* t1 = single ? tile[1] : accp + g.M * kQNR;
        detail::EpiBlock blk;
        blk.m0 = m0;
        blk.rows = rows_t;
        blk.ldt = kQNR;
        int64_t col0;
        int width;
        if (g.act == Act::swiglu) {  // gate tile 0, up tile 1: output columns of the gate half
          im.cols(unit * 2, &col0, &width);
          blk.t = t0;
          blk.u = t1;
          blk.col0 = col0;
          blk.bcol = col0;
          blk.ucol = col0 + N / 2;
          blk.width = width;
          epilogue(e, blk);
        } else {
          for (int64_t q = 0; q < per_unit; ++q) {
            im.cols(unit * per_unit + q, &col0, &width);
            blk.t = q ? t1 : t0;
            blk.col0 = col0;
            blk.bcol = col0;
            blk.width = width;
            epilogue(e, blk);
          }
        }
      }
    }
  });
}

}  // namespace ot::gemm
