// W8A8 grouped GEMM (ActivationQuant::int8_per_token, ot/gemm_quant.h): each activation row is
// quantised once per call (or taken as given int8 codes), then (expert, panel unit) work items run
// balanced row tiles of the kernel over the whole K and hand their fp32 tiles to the epilogue.
#include <algorithm>
#include <vector>

#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/quant.h"
#include "src/gemm/quant_internal.h"

namespace ot::gemm::qdetail {

namespace {

const QKernelA8 kTableA8[] = {
    {cpu::Isa::avx512, true, qkernel_avx512vnni_a8, 12, 4, "avx512vnni_w8a8"},
    {cpu::Isa::scalar, false, qkernel_scalar_a8, 4, 4, "scalar_w8a8"},
};

// Row `row` of the call into its int8 group blocks (zero codes pad each group to a8_len), the
// group sums and the row's scale.
void quantise_row(const PackedQuantB::Impl& im, const QuantGroup& g, int64_t r, std::vector<float>& f32, std::vector<int8_t>& i8, int8_t* dst,
                  int32_t* asum, float* ascale) {
  const int64_t K = im.K, lenp = a8_len(im.len), src = g.a_rows ? g.a_rows[r] : r;
  const char* x = static_cast<const char*>(g.a) + size_t(src * g.lda) * dtype_size(g.a_dtype);
  const bool packed = lenp == im.len;  // no padding: the row's codes are the blocks
  const int8_t* codes = nullptr;
  if (g.a_dtype == DType::i8) {
    codes = reinterpret_cast<const int8_t*>(x);
    *ascale = g.a_scale[src];
  } else {
    f32.resize(size_t(K));
    convert_to_f32(x, g.a_dtype, f32.data(), K);
    if (!packed) i8.resize(size_t(K));
    int8_t* q = packed ? dst : i8.data();
    *ascale = quantize_row_i8_dynamic(f32.data(), K, q);
    codes = q;
  }
  for (int64_t j = 0; j < im.groups; ++j) {
    const int8_t* cj = codes + j * im.len;
    int8_t* dj = dst + j * lenp;
    if (cj != dj) {
      std::copy(cj, cj + im.len, dj);
      std::fill(dj + im.len, dj + lenp, int8_t(0));
    }
    int32_t sum = 0;
    for (int64_t k = 0; k < im.len; ++k) sum += dj[k];
    asum[j] = sum;
  }
}

}  // namespace

const QKernelA8& select_qkernel_a8() {
  for (const QKernelA8& k : kTableA8)
    if (cpu::has(k.isa) && (!k.vnni || cpu::features().avx512_vnni)) return k;
  return kTableA8[std::size(kTableA8) - 1];
}

void grouped_gemm_a8(const PackedQuantB::Impl& im, const QuantGroup* groups, int64_t count, const int64_t* row0) {
  const int64_t rows = row0[count];
  if (rows == 0 || im.N == 0) return;
  const QKernelA8& kern = select_qkernel_a8();
  const int64_t lenp = a8_len(im.len), lda = im.groups * lenp;
  // Grow-only buffers of the calling thread (fresh pages each call fault under virtualisation).
  struct Buffers {
    detail::Buf a, asum, ascale;
  };
  thread_local Buffers buf;
  int8_t* a8 = reinterpret_cast<int8_t*>(buf.a.get(size_t(rows * lda)));
  int32_t* asum = reinterpret_cast<int32_t*>(buf.asum.get(size_t(rows * im.groups) * sizeof(int32_t)));
  float* ascale = reinterpret_cast<float*>(buf.ascale.get(size_t(rows) * sizeof(float)));
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> f32;
    std::vector<int8_t> i8;
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t i = int64_t(std::upper_bound(row0, row0 + count + 1, row) - row0) - 1;
      quantise_row(im, groups[i], row - row0[i], f32, i8, a8 + row * lda, asum + row * im.groups, ascale + row);
    }
  });
  // Work items (group, first unit, units). Groups of up to stream_rows rows take kStreamUnits
  // units an item and read the item's first half of panels beside its second half (two memory
  // streams per thread, as the weight-only decode path does); more rows: one unit an item, row
  // tiles over the whole K.
  const int64_t per_unit = im.split ? 2 : 1, units = im.npanels / per_unit;
  constexpr int64_t kStreamUnits = 4;
  auto streamed = [&](int64_t i) { return groups[i].M <= kern.stream_rows; };
  struct Item {
    int64_t group, unit0, units;
  };
  std::vector<Item> items;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t step = streamed(i) ? kStreamUnits : 1;
    if (groups[i].M > 0)
      for (int64_t u = 0; u < units; u += step) items.push_back({i, u, std::min(step, units - u)});
  }
  parallel_for_dynamic(int64_t(items.size()), 1, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> acc;  // [panels][M][32] (grow-only)
    for (int64_t it = b0; it < b1; ++it) {
      const Item& w = items[size_t(it)];
      const QuantGroup& g = groups[w.group];
      const int64_t np = w.units * per_unit, pstride = g.M * kQNR, row = row0[w.group];
      acc.resize(size_t(np * pstride));
      QA8Args ar{};
      ar.lda = lda, ar.ldas = im.groups, ar.groups = im.groups, ar.len = im.len;
      const char* p0 = im.panel(g.expert, w.unit0 * per_unit);
      if (streamed(w.group)) {
        ar.rows = int(g.M);
        ar.a = a8 + row * lda, ar.asum = asum + row * im.groups, ar.ascale = ascale + row;
        const int64_t h = np / 2;
        ar.panels = 2, ar.panel_step = size_t(h) * im.panel_bytes, ar.ldcp = h * pstride;
        for (int64_t q = 0; q < h; ++q) {
          ar.panel = p0 + size_t(q) * im.panel_bytes, ar.c = acc.data() + q * pstride;
          kern.fn(ar);
        }
        ar.panels = 1;
        for (int64_t q = 2 * h; q < np; ++q) {
          ar.panel = p0 + size_t(q) * im.panel_bytes, ar.c = acc.data() + q * pstride;
          kern.fn(ar);
        }
      } else {
        // Balanced tile heights (13 rows: 7 + 6, not 12 + 1: a one-row tile is latency bound).
        const int64_t ntiles = (g.M + kern.mr - 1) / kern.mr;
        for (int64_t q = 0; q < np; ++q) {
          ar.panel = p0 + size_t(q) * im.panel_bytes;
          for (int64_t t = 0, m0 = 0; m0 < g.M; ++t) {
            const int64_t hgt = (g.M - m0 + (ntiles - t) - 1) / (ntiles - t);
            ar.rows = int(hgt);
            ar.a = a8 + (row + m0) * lda, ar.asum = asum + (row + m0) * im.groups, ar.ascale = ascale + row + m0;
            ar.c = acc.data() + q * pstride + m0 * kQNR;
            kern.fn(ar);
            m0 += hgt;
          }
        }
      }
      for (int64_t u = 0; u < w.units; ++u)
        finish_unit(im, g, w.unit0 + u, g.M, acc.data() + u * per_unit * pstride, acc.data() + (u * per_unit + per_unit - 1) * pstride);
    }
  });
}

}  // namespace ot::gemm::qdetail
