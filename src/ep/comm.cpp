// The communicator wrapper, its buffer pool, the all-ranks agreement step and row helpers.
#include <algorithm>
#include <cmath>

#include "ot/numeric.h"
#include "src/ep/internal.h"

namespace ot::ep {

const char* dispatcher_name(Dispatcher d) { return d == Dispatcher::all_to_all ? "all_to_all" : "all_gather"; }

std::unique_ptr<Buffer> BufferPool::acquire(size_t bytes) {
  // Smallest free buffer that fits, else grow the largest one (keeps the pool small).
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i]->cap >= bytes && (best == free_.size() || free_[i]->cap < free_[best]->cap)) best = i;
  std::unique_ptr<Buffer> b;
  if (best < free_.size()) {
    b = std::move(free_[best]);
    free_.erase(free_.begin() + std::ptrdiff_t(best));
    return b;
  }
  if (!free_.empty()) {
    b = std::move(free_.back());
    free_.pop_back();
  } else {
    b = std::make_unique<Buffer>();
  }
  b->mem = make_aligned<char>(bytes);
  b->cap = bytes;
  return b;
}

void BufferPool::release(std::unique_ptr<Buffer> b) {
  if (b) free_.push_back(std::move(b));
}

MPI_Datatype Comm::Impl::row_type(int64_t bytes) {
  auto it = row_types.find(bytes);
  if (it != row_types.end()) return it->second;
  MPI_Datatype t;
  MPI_Type_contiguous(checked_int(bytes, "ep", "row bytes"), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  row_types[bytes] = t;
  return t;
}

void Comm::Impl::untrack(MPI_Request* r) { inflight.erase(std::remove(inflight.begin(), inflight.end(), r), inflight.end()); }

Comm::Comm(MPI_Comm comm, int64_t num_experts) : comm_(comm), impl_(std::make_unique<Impl>()) {
  int init = 0;
  MPI_Initialized(&init);
  OT_CHECK(init, "ep::Comm", "MPI", "MPI_Init called before creating the communicator", "not initialised");
  MPI_Comm_size(comm_, &world_);
  MPI_Comm_rank(comm_, &rank_);
  placement_ = Placement::contiguous(num_experts, world_);
}

Comm::~Comm() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    for (auto& [b, t] : impl_->row_types) MPI_Type_free(&t);
}

void Comm::set_placement(Placement p) {
  OT_CHECK(p.world_size() == world_, "ep::Comm::set_placement", "placement", "a placement over the communicator's ranks", p.world_size());
  placement_ = std::move(p);
}

void Comm::progress() {
  for (MPI_Request* r : impl_->inflight) {
    int flag = 0;
    if (*r != MPI_REQUEST_NULL) MPI_Test(r, &flag, MPI_STATUS_IGNORE);
  }
}

Tensor TensorPool::get(DType t, const std::vector<int64_t>& shape) {
  TensorView v(nullptr, t, shape);
  const size_t need = (std::max<size_t>(v.nbytes(), 1) + 63) & ~size_t(63);
  Block* best = nullptr;
  Block* free_small = nullptr;
  for (Block& b : blocks_) {
    if (b.mem.use_count() != 1) continue;  // still referred to by a caller's tensor
    if (b.cap >= need && (!best || b.cap < best->cap)) best = &b;
    if (b.cap < need && (!free_small || b.cap < free_small->cap)) free_small = &b;
  }
  if (!best) {
    Block nb{std::shared_ptr<void>(aligned_alloc64(need + need / 8), aligned_free), need + need / 8};
    if (free_small) *free_small = std::move(nb), best = free_small;  // a free block too small: replace it
    else if (blocks_.size() < 16) blocks_.push_back(std::move(nb)), best = &blocks_.back();
    else return Tensor::empty(t, shape);
  }
  v.data = best->mem.get();
  return Tensor::from_storage(best->mem, v);
}

Agreement::~Agreement() {
  if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
}

void agree_start(MPI_Comm comm, const Fault& fault, const Meta& meta, const std::vector<int64_t>& extra, Agreement& a) {
  int W = 1;
  MPI_Comm_size(comm, &W);
  // Record: [code, value, meta fields..., extra...]; extra has the same length on every rank.
  const size_t head = 2 + kMetaFields;
  a.extra = extra.size();
  a.mine.assign(head + extra.size(), 0);
  a.all.assign(size_t(W) * a.mine.size(), 0);
  a.mine[0] = fault.code;
  a.mine[1] = fault.value;
  std::copy(meta.f, meta.f + kMetaFields, a.mine.begin() + 2);
  std::copy(extra.begin(), extra.end(), a.mine.begin() + std::ptrdiff_t(head));
  MPI_Iallgather(a.mine.data(), int(a.mine.size()), MPI_INT64_T, a.all.data(), int(a.mine.size()), MPI_INT64_T, comm, &a.req);
}

std::vector<Meta> agree_finish(MPI_Comm comm, const char* op, Agreement& a, const std::vector<FaultText>& table,
                               const std::vector<std::pair<int, int>>& must_match, std::vector<int64_t>* extra_all) {
  MPI_Wait(&a.req, MPI_STATUS_IGNORE);
  int W = 1;
  MPI_Comm_size(comm, &W);
  const size_t head = 2 + kMetaFields, rec_len = a.mine.size();
  std::vector<Meta> out(static_cast<size_t>(W));
  if (extra_all) extra_all->resize(size_t(W) * a.extra);
  for (int r = 0; r < W; ++r) {
    const int64_t* rec = a.all.data() + size_t(r) * rec_len;
    if (extra_all) std::copy(rec + head, rec + rec_len, extra_all->begin() + std::ptrdiff_t(size_t(r) * a.extra));
    if (rec[0] != 0) {
      const FaultText& t = table.at(size_t(rec[0]));
      throw Error(op, t.arg, t.expected, detail::cat("rank ", r, ": ", rec[1]));
    }
    std::copy(rec + 2, rec + 2 + kMetaFields, out[size_t(r)].f);
  }
  for (auto [field, code] : must_match)
    for (int r = 1; r < W; ++r)
      if (out[size_t(r)].f[field] != out[0].f[field]) {
        const FaultText& t = table.at(static_cast<size_t>(code));
        throw Error(op, t.arg, t.expected, detail::cat("rank 0: ", out[0].f[field], ", rank ", r, ": ", out[size_t(r)].f[field]));
      }
  return out;
}

std::vector<Meta> agree(MPI_Comm comm, const char* op, const Fault& fault, const Meta& meta, const std::vector<FaultText>& table,
                        const std::vector<std::pair<int, int>>& must_match, const std::vector<int64_t>& extra,
                        std::vector<int64_t>* extra_all) {
  Agreement a;
  agree_start(comm, fault, meta, extra, a);
  return agree_finish(comm, op, a, table, must_match, extra_all);
}

void load_row_f32(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::f32) std::memcpy(dst, src, size_t(n) * 4);
  else convert_to_f32(src, t, dst, n);
}

float quantize_row_int8(const void* src, DType t, int64_t n, int8_t* dst) {
  std::vector<float> tmp;
  const float* v;
  if (t == DType::f32) {
    v = static_cast<const float*>(src);
  } else {
    tmp.resize(static_cast<size_t>(n));
    convert_to_f32(src, t, tmp.data(), n);
    v = tmp.data();
  }
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  float d = amax / 127.f;
  for (int64_t i = 0; i < n; ++i) {
    float q = d > 0 ? std::nearbyint(v[i] / d) : 0.f;  // round half to even (default rounding mode)
    dst[i] = int8_t(std::min(127.f, std::max(-128.f, q)));
  }
  return d;
}

}  // namespace ot::ep
