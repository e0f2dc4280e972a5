// The bf16 fused chunk forward (AVX512-BF16): for bf16 q/k/v the output products (Q S, P v_new)
// and the Gram matrices run on vdpbf16ps with fp32 accumulation; the state recurrence (W, U from
// the fp32 A and the exact bf16 K, V; v_new = U - W S; the state update) runs on fp32 operands, so
// the carried state only sees fp32 rounding (fla keeps it fp32 too; bf16 there grew the final
// state's error with T). Gram matrices come from the raw bf16 rows times the fp32 l2norm factors,
// so K K^T, Q K^T and hence A are as accurate as in the fp32 path.
#pragma once
#include <cstddef>
#include <cstdint>

#include "src/gdn/gdn_internal.h"

namespace ot::gdn::detail {

struct Bf16Fwd {
  Tok q, k, v, g, beta;        // inputs (q, k, v bf16 with unit element stride)
  Tok o, G, A, rq, rk;         // outputs (G, A, rq, rk optional)
  StateRef S0, fin;            // optional
  float* h = nullptr;          // optional (save_states): the state before every chunk, [chunk][HV][DK][DV]
  Tok v_new;                   // ... and v_new (fp32), with h
  const SeqInfo* s = nullptr;
  float scale = 1.f;
  bool l2 = false;
  bool widen = false;          // products on fp32 FMAs over widened bf16 (where vdpbf16ps is the slower)
  int64_t HK = 0, HV = 0, DK = 0, DV = 0;
};

// True when this machine and these shapes can take the bf16 path.
bool bf16_fused_ok(const Tok& q, const Tok& k, const Tok& v);
// One (sequence n, key head hk) task: all its chunks and the HV/HK value heads of the group.
void bf16_fused_task(const Bf16Fwd& a, int64_t n, int64_t hk);

}  // namespace ot::gdn::detail
