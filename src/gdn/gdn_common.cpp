// Layout canonicalisation, argument checks and varlen metadata shared by every GDN operator.
#include <atomic>
#include <mutex>
#if defined(__linux__)
#endif
#include <algorithm>
#include <cmath>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/numeric.h"
#include "src/gdn/gdn_internal.h"

namespace ot::gdn {

const char* layout_name(Layout l) { return l == Layout::BTHD ? "BTHD" : "BHTD"; }

int64_t SeqInfo::max_chunks_per_row() const {
  if (varlen) return num_chunks();
  return (tokens + kChunk - 1) / kChunk;
}

SeqInfo make_seq_info(int64_t B, int64_t T, const TensorView& cu, const char* op) {
  SeqInfo s;
  s.batch = B;
  s.tokens = T;
  if (cu.defined()) {
    OT_CHECK(cu.ndim == 1 && cu.sizes[0] >= 1, op, "cu_seqlens", "a 1-D host tensor [N+1]", cu.shape_str());
    OT_CHECK(cu.dtype == DType::i64 || cu.dtype == DType::i32, op, "cu_seqlens", "int64 or int32", dtype_name(cu.dtype));
    OT_CHECK(B == 1, op, "cu_seqlens", "a batch of 1 (packed varlen input)", "B = ", B);
    int64_t n1 = cu.sizes[0];
    std::vector<int64_t> c(static_cast<size_t>(n1));
    for (int64_t i = 0; i < n1; ++i) {
      int64_t off = i * cu.strides[0];
      c[size_t(i)] = cu.dtype == DType::i64 ? cu.ptr<int64_t>()[off] : int64_t(cu.ptr<int32_t>()[off]);
    }
    OT_CHECK(c[0] == 0, op, "cu_seqlens", "cu_seqlens[0] == 0", c[0]);
    for (int64_t i = 1; i < n1; ++i)
      OT_CHECK(c[size_t(i)] >= c[size_t(i - 1)], op, "cu_seqlens", "non-decreasing offsets", "cu_seqlens[", i, "] = ", c[size_t(i)],
               " < cu_seqlens[", i - 1, "] = ", c[size_t(i - 1)]);
    OT_CHECK(c.back() == T, op, "cu_seqlens", "last offset == T (tokens of the packed input)", c.back(), " vs T = ", T);
    s.varlen = true;
    for (int64_t n = 0; n + 1 < n1; ++n) {
      s.row.push_back(0);
      s.bos.push_back(c[size_t(n)]);
      s.len.push_back(c[size_t(n + 1)] - c[size_t(n)]);
    }
  } else {
    for (int64_t b = 0; b < B; ++b) {
      s.row.push_back(b);
      s.bos.push_back(0);
      s.len.push_back(T);
    }
  }
  s.chunk_offsets.push_back(0);
  for (int64_t n = 0; n < s.num_seqs(); ++n) {
    int64_t nc = (s.len[size_t(n)] + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < nc; ++c) {
      s.chunk_seq.push_back(int32_t(n));
      s.chunk_pos.push_back(int32_t(c));
    }
    s.chunk_offsets.push_back(s.chunk_offsets.back() + nc);
  }
  return s;
}

namespace detail {

float Tok::scalar(int64_t b, int64_t t, int64_t h) const {
  const void* q = at(b, t, h);
  switch (dt) {
    case DType::f32: return *static_cast<const float*>(q);
    case DType::bf16: return bf16_to_f32(*static_cast<const uint16_t*>(q));
    case DType::f16: return f16_to_f32(*static_cast<const uint16_t*>(q));
    default: return 0.f;
  }
}

double Tok::get(int64_t b, int64_t t, int64_t h, int64_t d) const {
  const char* q = static_cast<const char*>(at(b, t, h)) + d * sd * int64_t(dtype_size(dt));
  switch (dt) {
    case DType::f32: return *reinterpret_cast<const float*>(q);
    case DType::bf16: return bf16_to_f32(*reinterpret_cast<const uint16_t*>(q));
    case DType::f16: return f16_to_f32(*reinterpret_cast<const uint16_t*>(q));
    default: return 0.0;
  }
}

void Tok::set(int64_t b, int64_t t, int64_t h, int64_t d, double x) const {
  char* q = static_cast<char*>(at(b, t, h)) + d * sd * int64_t(dtype_size(dt));
  if (dt == DType::f32) *reinterpret_cast<float*>(q) = float(x);
  else if (dt == DType::bf16) *reinterpret_cast<uint16_t*>(q) = f32_to_bf16(float(x));
  else if (dt == DType::f16) *reinterpret_cast<uint16_t*>(q) = f32_to_f16(float(x));
}

// Token-indexed view: [B,T,H(,D)] / [B,H,T(,D)] or packed without B; `has_d` says whether the last
// dim is a feature dim (q, k, v) or absent (g, beta: D = 1).
static Tok tok_of(const TensorView& x, Layout l, const char* op, const char* arg, bool has_d) {
  OT_CHECK(x.defined() && x.data, op, arg, "a tensor", "undefined");
  const char* form = has_d ? (l == Layout::BTHD ? "[B,T,H,D] or packed [T,H,D]" : "[B,H,T,D] or packed [H,T,D]")
                           : (l == Layout::BTHD ? "[B,T,H] or packed [T,H]" : "[B,H,T] or packed [H,T]");
  int full = has_d ? 4 : 3;
  OT_CHECK(x.ndim == full || x.ndim == full - 1, op, arg, form, x.shape_str());
  expect_float(x.dtype, op, arg);
  Tok t;
  t.p = static_cast<char*>(x.data);
  t.dt = x.dtype;
  int o = x.ndim == full ? 1 : 0;
  t.packed = x.ndim == full - 1;
  t.B = o ? x.sizes[0] : 1;
  t.sb = o ? x.strides[0] : 0;
  int ti = l == Layout::BTHD ? o : o + 1, hi = l == Layout::BTHD ? o + 1 : o;
  t.T = x.sizes[ti];
  t.st = x.strides[ti];
  t.H = x.sizes[hi];
  t.sh = x.strides[hi];
  t.D = has_d ? x.sizes[o + 2] : 1;
  t.sd = has_d ? x.strides[o + 2] : 0;
  return t;
}

Tok tok_vec(const TensorView& x, Layout l, const char* op, const char* arg) { return tok_of(x, l, op, arg, true); }
Tok tok_scal(const TensorView& x, Layout l, const char* op, const char* arg) { return tok_of(x, l, op, arg, false); }

Tensor new_vec(Layout l, bool packed, DType dt, int64_t B, int64_t T, int64_t H, int64_t D, bool zero) {
  std::vector<int64_t> s = l == Layout::BTHD ? std::vector<int64_t>{B, T, H, D} : std::vector<int64_t>{B, H, T, D};
  if (packed) s.erase(s.begin());
  if (zero) return Tensor::zeros(dt, s);
  return pooled_empty(dt, s);
}

Tensor new_scal(Layout l, bool packed, DType dt, int64_t B, int64_t T, int64_t H) {
  std::vector<int64_t> s = l == Layout::BTHD ? std::vector<int64_t>{B, T, H} : std::vector<int64_t>{B, H, T};
  if (packed) s.erase(s.begin());
  return pooled_empty(dt, s);
}

void expect_bt(const Tok& x, int64_t B, int64_t T, const char* op, const char* arg) {
  OT_CHECK(x.B == B && x.T == T, op, arg, ::ot::detail::cat("batch ", B, " and ", T, " tokens like q"),
           ::ot::detail::cat("batch ", x.B, " and ", x.T, " tokens"));
}
void expect_heads(const Tok& x, int64_t H, const char* op, const char* arg) {
  OT_CHECK(x.H == H, op, arg, ::ot::detail::cat(H, " heads"), x.H);
}
void expect_dim(const Tok& x, int64_t D, const char* op, const char* arg) {
  OT_CHECK(x.D == D, op, arg, ::ot::detail::cat("head dim ", D), x.D);
}
void expect_float(DType t, const char* op, const char* arg) {
  OT_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, op, arg, "fp32, bf16 or fp16", dtype_name(t));
}
void expect_groups(int64_t HV, int64_t HK, const char* op) {
  OT_CHECK(HK > 0 && HV > 0 && HV % HK == 0, op, "v", ::ot::detail::cat("a number of value heads that is a multiple of HK = ", HK), "HV = ", HV);
}
void expect_value_heads(std::initializer_list<NamedTok> ts, int64_t B, int64_t T, int64_t HV, int64_t HK, const char* op) {
  expect_groups(HV, HK, op);
  for (auto [t, name] : ts) {
    expect_bt(*t, B, T, op, name);
    expect_heads(*t, HV, op, name);
  }
}
void expect_like_q(const TensorView& k, const TensorView& q, const char* op) {
  OT_CHECK(k.shape() == q.shape(), op, "k", ::ot::detail::cat("the shape of q ", q.shape_str()), k.shape_str());
}
void expect_qkv(const TensorView& q, const TensorView& k, const TensorView& v, const Tok& qt, const Tok& vt, const char* op) {
  expect_like_q(k, q, op);
  OT_CHECK(v.ndim == q.ndim, op, "v", "the rank of q", v.ndim);
  expect_bt(vt, qt.B, qt.T, op, "v");
  expect_groups(vt.H, qt.H, op);
  OT_CHECK(qt.D >= 1 && qt.D <= 256, op, "q", "a key head dim in [1, 256]", qt.D);
  OT_CHECK(vt.D >= 1 && vt.D <= 256, op, "v", "a value head dim in [1, 256]", vt.D);
}
Qkv read_qkv(const TensorView& q, const TensorView& k, const TensorView& v, Layout l, const char* op) {
  Qkv a;
  a.q = tok_vec(q, l, op, "q");
  a.k = tok_vec(k, l, op, "k");
  a.v = tok_vec(v, l, op, "v");
  a.B = a.q.B, a.T = a.q.T, a.HK = a.q.H, a.DK = a.q.D, a.HV = a.v.H, a.DV = a.v.D;
  expect_qkv(q, k, v, a.q, a.v, op);
  return a;
}
Tok opt_scal(const TensorView& x, Layout l, int64_t B, int64_t T, int64_t H, const char* op, const char* arg) {
  if (!x.defined()) return {};
  Tok t = tok_scal(x, l, op, arg);
  expect_bt(t, B, T, op, arg);
  expect_heads(t, H, op, arg);
  return t;
}

namespace avx512 {
bool any_exp_all_ones16(const uint16_t* p, int64_t n, uint16_t mask);
bool any_exp_all_ones32(const uint32_t* p, int64_t n);
}  // namespace avx512
namespace {
// Exponent all ones (Inf or NaN), tested on the bits so the loop vectorises.
template <class U> bool any_nonfinite(const char* base, int64_t n, int64_t stride, U mask) {
  const U* p = reinterpret_cast<const U*>(base);
  bool bad = false;
  if (stride == 1 && cpu::has(cpu::Isa::avx512)) {
    if constexpr (sizeof(U) == 2) return avx512::any_exp_all_ones16(p, n, mask);
    else return avx512::any_exp_all_ones32(p, n);
  }
  if (stride == 1) {
    // A count (not an early-exit or) so the loop vectorises to compares and adds.
    int64_t cnt = 0;
    for (int64_t d = 0; d < n; ++d) cnt += (p[d] & mask) == mask;
    bad = cnt != 0;
  } else {
    for (int64_t d = 0; d < n; ++d) bad |= (p[d * stride] & mask) == mask;
  }
  return bad;
}
// Any non-finite among n contiguous elements of a float dtype: blocks of 64 Ki elements over the
// threads.
bool any_nonfinite_span(const char* p, int64_t n, DType dt) {
  std::atomic<bool> any{false};
  const int64_t blk = 65536;
  const size_t es = dtype_size(dt);
  parallel_for((n + blk - 1) / blk, [&](int64_t i0, int64_t i1) {
    const char* base = p + i0 * blk * int64_t(es);
    int64_t m = std::min(n, i1 * blk) - i0 * blk;
    bool bad = es == 4 ? any_nonfinite<uint32_t>(base, m, 1, 0x7f800000u)
                       : any_nonfinite<uint16_t>(base, m, 1, uint16_t(dt == DType::bf16 ? 0x7f80 : 0x7c00));
    if (bad) any = true;
  });
  return any;
}
}  // namespace

void expect_finite(const Tok& x, const char* op, const char* arg) {
  // Fast pass over all threads (rows of contiguous heads checked as one span); the serial pass
  // below only runs to name the first bad element.
  std::atomic<bool> any{false};
  const size_t es = dtype_size(x.dt);
  const bool span = x.sd == 1 && x.sh == x.D;
  if (span && x.st == x.H * x.D && (x.B == 1 || x.sb == x.T * x.st)) {
    // One contiguous block (BTHD, TND).
    if (any_nonfinite_span(x.p, x.B * x.T * x.st, x.dt)) any = true;
  } else
  parallel_for(x.B * x.T, [&](int64_t i0, int64_t i1) {
    bool bad = false;
    for (int64_t i = i0; i < i1 && !bad; ++i)
      for (int64_t h = 0; h < (span ? 1 : x.H); ++h) {
        const char* base = static_cast<const char*>(x.at(i / x.T, i % x.T, h));
        int64_t n = span ? x.H * x.D : x.D;
        bad |= es == 4 ? any_nonfinite<uint32_t>(base, n, x.sd, 0x7f800000u)
                       : any_nonfinite<uint16_t>(base, n, x.sd, uint16_t(x.dt == DType::bf16 ? 0x7f80 : 0x7c00));
      }
    if (bad) any = true;
  });
  if (!any) return;
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t t = 0; t < x.T; ++t)
      for (int64_t h = 0; h < x.H; ++h) {
        const char* base = static_cast<const char*>(x.at(b, t, h));
        bool bad = x.dt == DType::f32    ? any_nonfinite<uint32_t>(base, x.D, x.sd, 0x7f800000u)
                   : x.dt == DType::bf16 ? any_nonfinite<uint16_t>(base, x.D, x.sd, uint16_t(0x7f80))
                                         : any_nonfinite<uint16_t>(base, x.D, x.sd, uint16_t(0x7c00));
        OT_CHECK(!bad, op, arg, "finite values", "NaN or Inf at token ", t, " head ", h, x.B > 1 ? ::ot::detail::cat(" batch ", b) : "");
      }
}

void expect_finite(const TensorView& x, const char* op, const char* arg) {
  int64_t n = x.numel();
  // Contiguous float storage: the vectorised pass, and the element loop only to name the element.
  if (x.is_contiguous() && (x.dtype == DType::f32 || x.dtype == DType::bf16 || x.dtype == DType::f16) &&
      !any_nonfinite_span(static_cast<const char*>(x.data), n, x.dtype))
    return;
  for (int64_t i = 0; i < n; ++i) OT_CHECK(std::isfinite(get_as_double(x, i)), op, arg, "finite values", "NaN or Inf at element ", i);
}

namespace {
void expect_state_shape(const TensorView& s, int64_t N, int64_t HV, int64_t DK, int64_t DV, const char* op, const char* arg) {
  OT_CHECK(s.ndim == 4 && s.sizes[0] == N && s.sizes[1] == HV && s.sizes[2] == DK && s.sizes[3] == DV, op, arg,
           ::ot::detail::cat("[", N, ", ", HV, ", ", DK, ", ", DV, "] (N, HV, DK, DV)"), s.shape_str());
}
void expect_state_rows(const TensorView& s, int64_t DV, const char* op, const char* arg) {
  OT_CHECK(s.strides[3] == 1 && s.strides[2] == DV, op, arg, "rows of DK x DV contiguous", s.shape_str());
}
}  // namespace

void expect_state(const TensorView& s, int64_t N, int64_t HV, int64_t DK, int64_t DV, bool allow_bf16, const char* op, const char* arg) {
  expect_state_shape(s, N, HV, DK, DV, op, arg);
  OT_CHECK(s.dtype == DType::f32 || (allow_bf16 && s.dtype == DType::bf16), op, arg, allow_bf16 ? "fp32 or bf16" : "fp32",
           dtype_name(s.dtype));
  expect_state_rows(s, DV, op, arg);
}

void expect_state_input(const TensorView& s, int64_t N, int64_t HV, int64_t DK, int64_t DV, const char* op, const char* arg) {
  expect_state_shape(s, N, HV, DK, DV, op, arg);
  OT_CHECK(s.dtype == DType::f32 || s.dtype == DType::bf16 || s.dtype == DType::f16, op, arg, "fp32, bf16 or fp16",
           dtype_name(s.dtype));
  expect_state_rows(s, DV, op, arg);
}

TensorView state_f32(const TensorView& s, Tensor& storage) {
  if (!s.defined() || s.dtype == DType::f32) return s;
  storage = Tensor::empty(DType::f32, s.shape());
  copy_into(s, storage.view());
  return storage.view();
}

Tensor state_as(Tensor fp32_state, DType dt, const char* op, const char* arg) {
  OT_CHECK(dt == DType::f32 || dt == DType::bf16 || dt == DType::f16, op, arg, "fp32, bf16 or fp16", dtype_name(dt));
  if (!fp32_state.defined() || dt == DType::f32) return fp32_state;
  Tensor r = Tensor::empty(dt, fp32_state.shape());
  copy_into(fp32_state.view(), r.view());
  return r;
}

const SeqInfo& resolve_seq(const Common& c, int64_t B, int64_t T, SeqInfo& storage, const char* op) {
  if (c.seq) {
    OT_CHECK(c.seq->batch == B && c.seq->tokens == T, op, "seq", ::ot::detail::cat("metadata for batch ", B, " and ", T, " tokens"),
             "batch ", c.seq->batch, " and ", c.seq->tokens, " tokens");
    return *c.seq;
  }
  storage = make_seq_info(B, T, c.cu_seqlens, op);
  return storage;
}

void load_rows(const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h, float* dst, int64_t ld) {
  size_t es = dtype_size(x.dt);
  for (int64_t i = 0; i < L; ++i) {
    const char* src = static_cast<const char*>(x.at(b, t0 + i, h));
    if (x.sd == 1) {
      convert_to_f32(src, x.dt, dst + i * ld, x.D);
    } else {
      for (int64_t d = 0; d < x.D; ++d) {
        const char* q = src + d * x.sd * int64_t(es);
        dst[i * ld + d] = x.dt == DType::f32 ? *reinterpret_cast<const float*>(q)
                          : x.dt == DType::bf16 ? bf16_to_f32(*reinterpret_cast<const uint16_t*>(q))
                                                : f16_to_f32(*reinterpret_cast<const uint16_t*>(q));
      }
    }
  }
}

void store_rows(const float* src, int64_t ld, const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h) {
  size_t es = dtype_size(x.dt);
  for (int64_t i = 0; i < L; ++i) {
    char* dst = static_cast<char*>(x.at(b, t0 + i, h));
    if (x.sd == 1) {
      convert_from_f32(src + i * ld, dst, x.dt, x.D);
    } else {
      for (int64_t d = 0; d < x.D; ++d) {
        char* q = dst + d * x.sd * int64_t(es);
        float v = src[i * ld + d];
        if (x.dt == DType::f32) *reinterpret_cast<float*>(q) = v;
        else if (x.dt == DType::bf16) *reinterpret_cast<uint16_t*>(q) = f32_to_bf16(v);
        else *reinterpret_cast<uint16_t*>(q) = f32_to_f16(v);
      }
    }
  }
}

void load_scal(const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h, float* dst) {
  for (int64_t i = 0; i < L; ++i) dst[i] = x.scalar(b, t0 + i, h);
}

float* chunk_states(const TensorView& x, const SeqInfo& s, int64_t HV, int64_t DK, int64_t DV, const char* op, const char* arg) {
  OT_CHECK(x.defined() && x.data, op, arg, "a per-chunk state tensor", "undefined");
  OT_CHECK(x.dtype == DType::f32, op, arg, "fp32", dtype_name(x.dtype));
  OT_CHECK(x.ndim == 5 && x.sizes[0] * x.sizes[1] == s.num_chunks() && x.sizes[2] == HV && x.sizes[3] == DK && x.sizes[4] == DV &&
               x.is_contiguous(),
           op, arg, ::ot::detail::cat("contiguous [B, NT, ", HV, ", ", DK, ", ", DV, "] with B * NT = ", s.num_chunks(), " chunks"), x.shape_str());
  return x.ptr<float>();
}

Tensor new_chunk_states(const SeqInfo& s, int64_t HV, int64_t DK, int64_t DV) {
  return pooled_empty(DType::f32, {s.varlen ? 1 : s.batch, s.varlen ? s.num_chunks() : s.max_chunks_per_row(), HV, DK, DV});
}

StateRef state_ref(const TensorView& s) {
  StateRef r;
  if (!s.defined() || !s.data) return r;
  r.p = static_cast<char*>(s.data);
  r.dt = s.dtype;
  r.sn = s.strides[0];
  r.sh = s.strides[1];
  r.DK = s.sizes[2];
  r.DV = s.sizes[3];
  return r;
}

void store_scal(const float* src, const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h) {
  for (int64_t i = 0; i < L; ++i) x.set(b, t0 + i, h, 0, src[i]);
}

ChunkScratch::ChunkScratch(int64_t DK, int64_t DV) {
  D_ = std::max(DK, DV);
  rows_ = plan_.add<float>(size_t(7 * kChunk * D_), true);
  vecs_ = plan_.add<float>(size_t(5 * kChunk), true);
  mats_ = plan_.add<float>(size_t(3 * kChunk * kChunk), true);
  state_ = plan_.add<float>(size_t(DK * DV), true);
  ws_ = std::make_unique<Workspace>(plan_);
}

ChunkBufs ChunkScratch::get(int tid) const {
  ChunkBufs b;
  float* r = ws_->get(rows_, tid);
  size_t R = size_t(kChunk * D_);
  b.q = r, b.k = r + R, b.v = r + 2 * R, b.w = r + 3 * R, b.u = r + 4 * R, b.o = r + 5 * R, b.t = r + 6 * R;
  float* v = ws_->get(vecs_, tid);
  b.g = v, b.G = v + kChunk, b.beta = v + 2 * kChunk, b.rq = v + 3 * kChunk, b.rk = v + 4 * kChunk;
  float* m = ws_->get(mats_, tid);
  b.E = m, b.M = m + kChunk * kChunk, b.A = m + 2 * kChunk * kChunk;
  b.S = ws_->get(state_, tid);
  return b;
}

int64_t h_index(const SeqInfo& s, int64_t n, int64_t c) { return s.chunk_id(n, c); }

std::string shape_args(const TensorView& q, const TensorView& v, Layout l) {
  return ::ot::detail::cat("q ", q.shape_str(), " v ", v.shape_str(), " ", layout_name(l));
}

}  // namespace detail
}  // namespace ot::gdn
