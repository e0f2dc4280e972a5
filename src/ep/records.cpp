// Records: writing them, the node-window slots they name, and the all-ranks decision.
#include "src/ep/records.h"

#include <algorithm>
#include <cstring>

#include "ot/error.h"
#include "src/ep/internal.h"

namespace ot::ep {

void write_record(char* dst, const Fault& fault, const Meta& meta, const int64_t* extra, size_t n_extra) {
  int64_t* r = reinterpret_cast<int64_t*>(dst);
  std::memset(dst, 0, record_bytes(n_extra));
  r[0] = fault.code;
  r[1] = fault.value;
  std::copy(meta.f, meta.f + kMetaFields, r + 2);
  r[kRecHead - 1] = int64_t(n_extra);
  if (n_extra) std::copy(extra, extra + n_extra, r + kRecHead);
}

std::vector<char> own_record(const Fault& fault, const Meta& meta, const int64_t* extra, size_t n_extra) {
  std::vector<char> own(record_bytes(n_extra));
  write_record(own.data(), fault, meta, extra, n_extra);
  return own;
}

const char* payload_of(const PeerExchange& ex, int q, size_t n_extra, size_t payload, const char* op, const char* expected) {
  const size_t rec = record_bytes(n_extra);
  OT_CHECK(ex.size(q) == rec + payload, op, "message", expected, ex.size(q));
  return ex.data(q) + rec;
}

namespace {

// Slots named by the well-formed, fault-free records among `rec` (this rank's own excluded).
std::vector<std::pair<int, int64_t>> slots_in_records(const std::vector<const char*>& rec, const std::vector<size_t>& size, int me,
                                                      int meta_field) {
  std::vector<std::pair<int, int64_t>> held;
  for (size_t r = 0; r < rec.size(); ++r) {
    if (int(r) == me || size[r] < record_bytes(0)) continue;
    const int64_t* p = reinterpret_cast<const int64_t*>(rec[r]);
    const int64_t n_extra = p[kRecHead - 1];
    if (p[0] != 0) continue;  // a faulty rank writes no rows
    int64_t g = 0;
    if (meta_field >= 0) g = p[2 + meta_field];
    else if (n_extra >= 1 && n_extra < (1 << 20) && size[r] >= record_bytes(size_t(n_extra))) g = p[kRecHead + n_extra - 1];
    if (g > 0) held.emplace_back(int(r), g - 1);
  }
  return held;
}

Decision decide(const char* op, const std::vector<const char*>& rec, const std::vector<size_t>& rec_size,
                const std::vector<FaultText>& table, const std::vector<std::pair<int, int>>& must_match) {
  const size_t W = rec.size();
  Decision d;
  d.meta.resize(W);
  d.extra.resize(W);
  d.n_extra.resize(W);
  for (size_t r = 0; r < W; ++r) {  // a message too short for its record is a peer on another protocol
    const int64_t* p = reinterpret_cast<const int64_t*>(rec[r]);
    if (rec_size[r] < record_bytes(0) || rec_size[r] < record_bytes(size_t(std::max<int64_t>(0, p[kRecHead - 1]))))
      throw Error(op, "call", "the same collective call on every rank", detail::cat("rank ", r, " sent a ", rec_size[r], "-byte message"));
  }
  for (size_t r = 0; r < W; ++r) {
    const int64_t* p = reinterpret_cast<const int64_t*>(rec[r]);
    if (p[0] != 0) {
      const FaultText& t = table.at(size_t(p[0]));
      throw Error(op, t.arg, t.expected, detail::cat("rank ", r, ": ", p[1]));
    }
    std::copy(p + 2, p + 2 + kMetaFields, d.meta[r].f);
    d.n_extra[r] = p[kRecHead - 1];
    d.extra[r] = p + kRecHead;
  }
  for (auto [field, code] : must_match)
    for (size_t r = 1; r < W; ++r)
      if (d.meta[r].f[field] != d.meta[0].f[field]) {
        const FaultText& t = table.at(static_cast<size_t>(code));
        throw Error(op, t.arg, t.expected, detail::cat("rank 0: ", d.meta[0].f[field], ", rank ", r, ": ", d.meta[r].f[field]));
      }
  return d;
}

}  // namespace

Decision agree(const char* op, const PeerExchange& ex, int me, const std::vector<char>& own, int slot_field,
               std::vector<std::pair<int, int64_t>>& held, const std::vector<FaultText>& table,
               const std::vector<std::pair<int, int>>& must_match) {
  const size_t W = ex.world();
  std::vector<const char*> rec(W);
  std::vector<size_t> size(W);
  for (size_t r = 0; r < W; ++r) {
    rec[r] = int(r) == me ? own.data() : ex.data(int(r));
    size[r] = int(r) == me ? own.size() : ex.size(int(r));
  }
  held = slots_in_records(rec, size, me, slot_field);
  return decide(op, rec, size, table, must_match);
}

}  // namespace ot::ep
