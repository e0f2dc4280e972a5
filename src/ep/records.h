// Records and message layout of the expert-parallel exchanges. Every message between ranks starts
// with a record (fault, meta, extra), so each rank's validation outcome travels with its data and
// the decision costs no round of its own: every rank sees every record and either all proceed or
// all throw the same ot::Error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ot::ep {

class PeerExchange;

struct Fault {
  int code = 0;        // 0: fine; otherwise an index into the caller's table of {arg, expected}
  int64_t value = 0;   // what was got (for the message)
};
struct FaultText { const char* arg; const char* expected; };
constexpr int kMetaFields = 20;
struct Meta {
  int64_t f[kMetaFields] = {};
};
constexpr size_t kRecHead = 2 + kMetaFields + 1;  // code, value, meta, n_extra
inline size_t record_bytes(size_t n_extra) { return (8 * (kRecHead + n_extra) + 63) & ~size_t(63); }
// Writes a record at dst (record_bytes(n_extra) bytes).
void write_record(char* dst, const Fault& fault, const Meta& meta, const int64_t* extra = nullptr, size_t n_extra = 0);
// This rank's own record (it travels nowhere: agree() reads it in this rank's place).
std::vector<char> own_record(const Fault& fault, const Meta& meta, const int64_t* extra = nullptr, size_t n_extra = 0);

// Where the messages of one exchange lie in its send buffer: one per other rank, each starting
// 64-byte aligned ([record][payload]).
struct MessageLayout {
  std::vector<size_t> off, len;  // [W] message to q: len[q] bytes at off[q] (this rank's stay 0)
  size_t total = 0;
  explicit MessageLayout(int W) : off(size_t(W), 0), len(size_t(W), 0) {}
  void add(int q, size_t bytes) {
    off[size_t(q)] = total;
    len[size_t(q)] = bytes;
    total += (bytes + 63) & ~size_t(63);
  }
  size_t buffer_bytes() const { return total > 64 ? total : 64; }
};

// The payload of q's message in a completed exchange: what follows its record (of n_extra values),
// checked to be `payload` bytes (an ot::Error of op naming "message" with `expected` otherwise).
const char* payload_of(const PeerExchange& ex, int q, size_t n_extra, size_t payload, const char* op, const char* expected);

// The decision from every rank's record once `ex` has completed (peers' at the head of their
// messages, this rank's own from `own`): throws on every rank alike when any rank has a fault or
// when the fields in `must_match` (field, code) differ; else returns the metas and points extra[r]
// at each record's extra values (n_extra[r]). Before deciding, `held` gets the node-window slots
// that fault-free peers name (window + 1 in meta field `slot_field`, or in the last extra value
// when slot_field < 0; 0 = none), so a call that throws still frees the slots its peers wrote.
struct Decision {
  std::vector<Meta> meta;
  std::vector<const int64_t*> extra;
  std::vector<int64_t> n_extra;
};
Decision agree(const char* op, const PeerExchange& ex, int me, const std::vector<char>& own, int slot_field,
               std::vector<std::pair<int, int64_t>>& held, const std::vector<FaultText>& table,
               const std::vector<std::pair<int, int>>& must_match);

}  // namespace ot::ep
