#include "ep_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "ot/numeric.h"

namespace ot::ep::test {

int W() { int w; MPI_Comm_size(MPI_COMM_WORLD, &w); return w; }
int me() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int64_t two_per_rank() { return std::max<int64_t>(4, 2 * W()); }

Tensor uniform(const std::vector<int64_t>& shape, Rng& g, float lo, float hi) {
  Tensor t = Tensor::empty(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = lo + (hi - lo) * g.uni();
  return t;
}

Tensor full(const std::vector<int64_t>& shape, float value) {
  Tensor t = Tensor::empty(DType::f32, shape);
  std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), value);
  return t;
}

Inputs make_inputs(const Case& c, int world, uint64_t seed) {
  Inputs all;
  for (int r = 0; r < world; ++r) {
    Rng g(seed * 1000 + uint64_t(r));
    int64_t BS = c.bs(r);
    Tensor x = Tensor::empty(c.dtype, {BS, c.H}), ids = Tensor::empty(DType::i32, {BS, c.K}), w = Tensor::empty(DType::f32, {BS, c.K});
    for (int64_t i = 0; i < BS * c.H; ++i) set_from_double(x, i, 2.0 * g.uni() - 1.0);
    for (int64_t t = 0; t < BS; ++t) {
      std::vector<int> pool;
      if (c.pool) pool = c.pool(r, t);
      else for (int e = 0; e < c.E; ++e) pool.push_back(e);
      for (int64_t k = 0; k < c.K; ++k) {  // partial Fisher-Yates: distinct ids
        size_t j = size_t(k) + g.next() % (pool.size() - size_t(k));
        std::swap(pool[size_t(k)], pool[j]);
        ids.ptr<int32_t>()[t * c.K + k] = pool[size_t(k)];
        w.ptr<float>()[t * c.K + k] = 0.1f + g.uni();
      }
    }
    all.push_back({x, ids, w});
  }
  return all;
}

std::vector<ref::RankInput> views(const Inputs& in) {
  std::vector<ref::RankInput> v;
  for (auto& r : in) v.push_back({r[0].view(), r[1].view(), r[2].view()});
  return v;
}

int64_t rows_arriving(const Inputs& in, const Placement& p, const std::function<bool(int, int64_t, int64_t, int)>& keep) {
  int64_t n = 0;
  for (size_t r = 0; r < in.size(); ++r) {
    const int64_t K = in[r][1].size(1);
    for (int64_t t = 0; t < in[r][0].size(0); ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int e = in[r][1].ptr<int32_t>()[t * K + k];
        n += keep(int(r), t, k, e) && p.destination(int(r), t, e) == me();
      }
  }
  return n;
}

std::vector<int32_t> assist_of(const DispatchResult& d) {
  const int32_t* a = d.assist_info_for_combine.ptr<int32_t>();
  return std::vector<int32_t>(a, a + 3 * d.expand_x.size(0));
}

Experts::Experts(int64_t E, int64_t H_, int64_t I_) : H(H_), I(I_) {
  Rng g(777);
  const float sh = 1 / std::sqrt(float(H)), si = 1 / std::sqrt(float(I));
  for (int64_t e = 0; e < E; ++e) {
    Tensor a = uniform({H, 2 * I}, g, -sh, sh), b = uniform({I, H}, g, -si, si);
    gu.push_back(gemm::prepack(a, gemm::BLayout::KN));
    dn.push_back(gemm::prepack(b, gemm::BLayout::KN));
  }
}

ExpertFn Experts::local(const Placement& p, int q) const {
  std::vector<const gemm::PackedB*> a, b;
  for (int64_t e : p.local_experts(q)) a.push_back(&gu[size_t(e)]), b.push_back(&dn[size_t(e)]);
  return swiglu_experts(a, b);
}

ExpertFn Experts::all() const {
  std::vector<const gemm::PackedB*> a, b;
  for (size_t e = 0; e < gu.size(); ++e) a.push_back(&gu[e]), b.push_back(&dn[e]);
  return swiglu_experts(a, b);
}

std::vector<Tensor> single_process(const Inputs& in, const Experts& ex, int64_t E, DType out_dtype, const SpecialFn& special) {
  const int64_t H = in[0][0].size(1), K = in[0][1].size(1);
  std::vector<std::tuple<int, int64_t, int64_t>> rows;  // (r, t, k)
  ExpertBatch b;
  for (int64_t e = 0; e < E; ++e) {
    int64_t begin = int64_t(rows.size());
    for (size_t r = 0; r < in.size(); ++r)
      for (int64_t t = 0; t < in[r][0].size(0); ++t)
        for (int64_t k = 0; k < K; ++k)
          if (in[r][1].ptr<int32_t>()[t * K + k] == e) rows.push_back({int(r), t, k});
    b.expert.push_back(e), b.row_begin.push_back(begin), b.rows.push_back(int64_t(rows.size()) - begin);
  }
  const int64_t A = int64_t(rows.size());
  const DType dt = in[0][0].dtype();
  const int64_t row_bytes = H * int64_t(dtype_size(dt));
  Tensor xs = Tensor::empty(dt, {A, H}), ys = Tensor::empty(dt, {A, H});
  for (int64_t i = 0; i < A; ++i) {
    auto [r, t, k] = rows[size_t(i)];
    std::memcpy(static_cast<char*>(xs.view().data) + i * row_bytes,
                static_cast<const char*>(in[size_t(r)][0].view().data) + t * row_bytes, size_t(row_bytes));
  }
  b.x = xs.view();
  b.y = ys.view();
  ex.all()(b);
  std::vector<std::vector<int64_t>> where(in.size());
  for (size_t r = 0; r < in.size(); ++r) where[r].assign(size_t(in[r][0].size(0) * K), -1);
  for (int64_t i = 0; i < A; ++i) {
    auto [r, t, k] = rows[size_t(i)];
    where[size_t(r)][size_t(t * K + k)] = i;
  }
  // The sum in k order with the MoE layer's combine step (ot::accumulate_f32: acc += w * row).
  std::vector<Tensor> out;
  std::vector<float> acc(static_cast<size_t>(H));
  for (size_t r = 0; r < in.size(); ++r) {
    int64_t BS = in[r][0].size(0);
    Tensor o = Tensor::empty(out_dtype, {BS, H});
    for (int64_t t = 0; t < BS; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = where[r][size_t(t * K + k)];
        const float w = in[r][2].ptr<float>()[t * K + k];
        if (i >= 0) {
          accumulate_f32(static_cast<const char*>(ys.view().data) + i * row_bytes, dt, w, acc.data(), H);
        } else {
          const int64_t s = in[r][1].ptr<int32_t>()[t * K + k] - E;
          for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * special(s, float(get_as_double(in[r][0], t * H + h)), h);
        }
      }
      for (int64_t h = 0; h < H; ++h) set_from_double(o, t * H + h, acc[size_t(h)]);
    }
    out.push_back(o);
  }
  return out;
}

Scenario::Scenario(const Case& c_, int64_t I, uint64_t seed, const SpecialFn& special, const CommOptions& copt)
    : c(c_), ex(c.E, c.H, I), in(make_inputs(c, W(), seed)), want(single_process(in, ex, c.E, DType::f32, special)),
      comm(MPI_COMM_WORLD, c.E, copt) {}

double norm_err(const TensorView& a, const TensorView& b) {
  double m = 0, s = 1e-30;
  for (int64_t i = 0; i < b.numel(); ++i) {
    m = std::max(m, std::fabs(get_as_double(a, i) - get_as_double(b, i)));
    s = std::max(s, std::fabs(get_as_double(b, i)));
  }
  return m / s;
}

bool bit_equal(const TensorView& a, const TensorView& b) {
  return a.numel() == b.numel() && a.dtype == b.dtype && (a.numel() == 0 || std::memcmp(a.data, b.data, a.nbytes()) == 0);
}

void expect_all_throw(const char* arg, const std::function<void()>& fn) {
  bool threw = false;
  try {
    fn();
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.arg(), arg) << e.what();
  }
  EXPECT_TRUE(threw) << arg;
}

Tensor run_blocking(Comm& comm, const std::vector<Tensor>& mine, const Experts& ex, const DispatchOptions& o, DispatchResult* keep,
                    const CombineInputs& ci) {
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor y = Tensor::empty(mine[0].dtype(), {d.expand_x.size(0), mine[0].size(1)});
  ex.local(comm.placement(), comm.ep_rank_id())(batch_of(d, y));
  Tensor out = moe_distribute_combine(comm, y, d, ci);
  if (keep) *keep = std::move(d);
  return out;
}

Tensor run_pipelined(Comm& comm, const std::vector<Tensor>& mine, const Experts& ex, const FfnOptions& f, const TensorView& shared_expert_x) {
  return ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), comm.ep_rank_id()), f, shared_expert_x);
}

}  // namespace ot::ep::test
