// Decoding of Gated DeltaNet inputs shared by the GDN targets: shapes, layouts (BTHD / BHTD,
// packed varlen 3-D forms), cu_seqlens, and values in a well-conditioned range (|k|^2 beta <= 1,
// log gates <= 0) so the chunked fp32 algorithm and the fp64 recurrence agree to rounding.
#pragma once
#include "fuzz/fuzz_util.h"
#include "ot/gdn.h"

namespace fz {

struct GdnShape {
  ot::gdn::Layout layout = ot::gdn::Layout::BTHD;
  int64_t B = 1, T = 0, HK = 1, HV = 1, DK = 1, DV = 1;
  bool varlen = false, packed = false;  // packed: 3-D views without B (varlen only)
  std::vector<int64_t> cu;
  // Token tensor [B,T,H,D] / [B,H,T,D] (packed: no B); scalars drop D.
  std::vector<int64_t> vec(int64_t H, int64_t D) const {
    bool bt = layout == ot::gdn::Layout::BTHD;
    std::vector<int64_t> s = bt ? std::vector<int64_t>{B, T, H, D} : std::vector<int64_t>{B, H, T, D};
    if (packed) s.erase(s.begin());
    return s;
  }
  std::vector<int64_t> scal(int64_t H) const {
    std::vector<int64_t> s = vec(H, 1);
    s.pop_back();
    return s;
  }
  int64_t seqs() const { return varlen ? int64_t(cu.size()) - 1 : B; }
};

// T: short, just past one chunk, or past two (the chunk size is 64).
inline int64_t gdn_tokens(Input& in, int64_t max_short) {
  switch (in.range(0, 5)) {
    case 0: return in.range(60, 70);
    case 1: return in.range(120, 132);
    default: return in.range(0, max_short);
  }
}

inline GdnShape gdn_shape(Input& in, int64_t max_short_T) {
  GdnShape s;
  s.layout = in.flag() ? ot::gdn::Layout::BHTD : ot::gdn::Layout::BTHD;
  s.varlen = in.byte() < 100;
  s.B = s.varlen ? 1 : in.range(1, 2);
  s.T = gdn_tokens(in, max_short_T);
  s.HK = in.range(1, 2);
  s.HV = s.HK * in.range(1, 2) + (in.byte() < 4 ? 1 : 0);
  s.DK = in.pick<int64_t>({in.range(1, 20), 16, 32, in.range(1, 40)});
  s.DV = in.pick<int64_t>({in.range(1, 20), 16, 32, in.range(1, 40)});
  if (in.byte() < 2) s.DK = 257;
  if (s.varlen) {
    s.packed = in.flag();
    s.cu.push_back(0);
    const int64_t N = in.range(1, 4);
    for (int64_t n = 0; n + 1 < N; ++n) s.cu.push_back(std::min(s.T, s.cu.back() + in.range(0, s.T)));
    s.cu.push_back(s.T);
    if (in.byte() < 6) s.cu[size_t(in.range(0, int64_t(s.cu.size()) - 1))] += in.pick<int64_t>({-1, 1});
  }
  return s;
}

inline Buf& cu_seqlens(Input& in, Arena& ar, const GdnShape& s) {
  Buf& c = ar.add("cu_seqlens", in.byte() < 200 ? ot::DType::i64 : ot::DType::i32, {int64_t(s.cu.size())});
  for (size_t i = 0; i < s.cu.size(); ++i) c.set(int64_t(i), double(s.cu[i]));
  return c;
}

// Values: q, k in [-1, 1] / sqrt(DK) (|k|^2 <= 1), v in [-1, 1], log gates in [-1, 0], beta in [0, 1].
inline Buf& gdn_vec(Input& in, Arena& ar, const char* name, ot::DType t, const std::vector<int64_t>& shape, double scale) {
  Buf& b = ar.add(name, t, shape, in.byte() < 30 ? in.range(1, 3) : 0);
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, in.grid(8, -1, 1) * scale);
  return b;
}
inline Buf& gdn_scal(Input& in, Arena& ar, const char* name, ot::DType t, const std::vector<int64_t>& shape, double lo, double hi) {
  Buf& b = ar.add(name, t, shape);
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, in.grid(8, lo, hi));
  if (b.numel() > 0 && in.byte() < 3) b.set(in.range(0, b.numel() - 1), in.pick({std::nan(""), HUGE_VAL}));
  return b;
}

inline double max_abs(const ot::TensorView& v) {
  double m = 0;
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, std::fabs(ot::get_as_double(v, i)));
  return m;
}
// Within rtol of each element plus `frac` of the largest reference magnitude (the chunked form
// sums whole chunks at once, so its error scales with the largest terms, not each element).
inline void expect_near(const char* what, const ot::Tensor& a, const ot::Tensor& b, double rtol, double frac) {
  FZ_ASSERT(a.defined() == b.defined(), what, ": defined ", a.defined(), " vs reference ", b.defined());
  if (!a.defined()) return;
  FZ_ASSERT(a.shape() == b.shape(), what, ": shape ", a.view().shape_str(), " vs reference ", b.view().shape_str());
  // A bf16 / fp16 output (a final state in final_state_dtype) may round one ulp apart.
  rtol = std::max(rtol, rtol_of(a.dtype()));
  expect_close(what, a.view(), b.view(), rtol, std::max(frac, rtol_of(a.dtype())) * max_abs(b.view()) + 1e-6);
}

}  // namespace fz
